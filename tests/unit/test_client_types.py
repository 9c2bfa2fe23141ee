"""The client's answer types (execbox_client.types) are the server's response schemas: each TypedDict has the
fields, required-ness and types of the component schema of its name in the app's OpenAPI document, and each
endpoint method is typed with what its route answers, so a change on either side fails here."""

from __future__ import annotations

import functools
import inspect
import json
import operator
import re
import subprocess
import sys
import typing
from typing import Any, Literal, NotRequired

import execbox_client
import pytest
from execbox_client import types
from execbox_client.client import Call, Endpoints

from execbox.api import create_app
from execbox.settings import Settings
from tests.unit.test_client_surface import CONVENIENCE, placeholders

pytestmark = pytest.mark.redis
UNTYPED = {("GET", "/readyz")}
"""Routes whose answer the document leaves open (their methods answer dict[str, Any])."""


def typed_dicts() -> dict[str, type]:
    return {name: cls for name, cls in vars(types).items() if typing.is_typeddict(cls)}


def aliases() -> dict[str, Any]:
    return {name: value for name, value in vars(types).items() if typing.get_origin(value) is typing.Literal}


def annotation(schema: dict[str, Any]) -> Any:
    """The type a schema is, written with the classes and aliases of execbox_client.types."""
    if "$ref" in schema:
        return getattr(types, schema["$ref"].rsplit("/", 1)[1])
    if "const" in schema:
        return Literal[schema["const"]]
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    if "anyOf" in schema:
        return functools.reduce(operator.or_, [annotation(part) for part in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "array":
        return list[annotation(schema.get("items", {}))]  # type: ignore[misc]
    if kind == "object":
        values = schema.get("additionalProperties")
        return dict[str, annotation(values) if isinstance(values, dict) and values else Any]  # type: ignore[misc]
    scalars: dict[Any, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": None}
    return scalars.get(kind, Any)


def answered(operation: dict[str, Any]) -> Any:
    """What a route answers, as its client method's return type would say it."""
    responses = [response for status, response in operation["responses"].items() if status.startswith("2")]
    assert len({json.dumps(response.get("content")) for response in responses}) == 1, operation["operationId"]
    content = responses[0].get("content")
    if not content:
        return type(None)
    if "application/json" not in content:
        return bytes
    return annotation(content["application/json"]["schema"])


def reachable(document: dict[str, Any], names: list[str]) -> set[str]:
    seen: set[str] = set()
    while names:
        name = names.pop()
        if name not in seen:
            seen.add(name)
            names += re.findall(r'"#/components/schemas/(\w+)"', json.dumps(document["components"]["schemas"][name]))
    return seen


@pytest.fixture
def document(settings: Settings) -> dict[str, Any]:
    return create_app(settings).openapi()


def test_each_answer_type_has_the_fields_of_its_response_schema(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name, cls in typed_dicts().items():
        schema = schemas[name]
        required = set(schema.get("required", []))
        assert cls.__required_keys__ == required, (name, cls.__required_keys__ ^ required)  # type: ignore[attr-defined]
        assert cls.__optional_keys__ == set(schema["properties"]) - required, name  # type: ignore[attr-defined]
        hints = typing.get_type_hints(cls, include_extras=True)
        wanted = {field: annotation(s) if field in required else NotRequired[annotation(s)]
                  for field, s in schema["properties"].items()}  # fmt: skip
        assert hints == wanted, {f: (hints.get(f), wanted[f]) for f in wanted if hints.get(f) != wanted[f]}
    for name, alias in aliases().items():
        assert list(typing.get_args(alias)) == schemas[name]["enum"], name


def test_every_schema_an_endpoint_answers_has_its_type(document: dict[str, Any]) -> None:
    answers = [
        name
        for path, operations in document["paths"].items() if not path.startswith("/v1/admin")
        for operation in operations.values()
        for response in operation["responses"].values()
        for name in re.findall(r'"#/components/schemas/(\w+)"', json.dumps(response.get("content") or {}))
    ]  # fmt: skip
    shared = reachable(document, [name for name in answers if name != "Problem"]) - reachable(document, ["Problem"])
    assert shared == set(typed_dicts()) | set(aliases())
    assert set(types.__all__) == shared
    assert set(typed_dicts()) >= {name for name in execbox_client.__all__ if name[0].isupper() and hasattr(types, name)}


class Recorder(Endpoints):
    def _send(self, call: Call[Any]) -> Call[Any]:
        return call


def test_each_endpoint_method_is_typed_with_what_its_route_answers(document: dict[str, Any]) -> None:
    recorder = Recorder()
    checked = 0
    for name, method in inspect.getmembers(Endpoints, inspect.isfunction):
        if name.startswith("_") or name in CONVENIENCE:
            continue
        call = method(recorder, *placeholders(method))
        returns = typing.get_args(typing.get_type_hints(inspect.unwrap(method))["return"])[0]
        if (call.method, call.path) in UNTYPED:
            assert returns == dict[str, Any], name
            continue
        assert returns == answered(document["paths"][call.path][call.method.lower()]), (name, call.path, returns)
        checked += 1
    assert checked >= 40, checked


def test_the_typed_client_still_imports_nothing_of_the_server_nor_pydantic() -> None:
    """The types are TypedDicts so that the client stays a light install (docs/decisions.md)."""
    code = (
        "import sys, execbox_client, execbox_client.cli\n"
        "print([m for m in ('pydantic', 'execbox') if m in sys.modules])"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout
