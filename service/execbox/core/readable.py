"""What is stored stays readable: JSON Schemas compiled before they are kept, and a record checked
with the model that will read it back before it is written.

A record Redis holds is read by a pydantic model on every later GET, list, cancel and reconcile. If
a request could store what that model refuses (a float that became `null`, one step too many, a
schema that cannot compile), every later read would be a 500 for the owner and a poison message
for the loops. So each writer checks here first and answers 422 naming the field instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.schemacheck import pattern_problem

M = TypeVar("M", bound=BaseModel)
_BASE = "urn:execbox:schema"
MAX_SCHEMA_REFS = 1000
"""Most `$ref`s one schema may hold (each is resolved when the schema is checked)."""


def schema_problems(schema: Any, field: str) -> list[FieldProblem]:
    """Problems of a JSON Schema (draft 2020-12) that is kept to validate later: it must be a valid
    schema, every `$ref` in it must resolve inside it (nothing is ever fetched) and every pattern
    must compile for RE2, the engine core.schemacheck applies them with (no backtracking)."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return [FieldProblem(field, f"not a valid JSON Schema{f' at /{where}' if where else ''}: {exc.message}")]
    if not isinstance(schema, dict):
        return []
    found = [FieldProblem(field, f"{why} (at {path or '/'})") for path, why in _pattern_problems(schema, "")]
    if found:
        return found
    resolver = Registry().with_resource(_BASE, DRAFT202012.create_resource(schema)).resolver(_BASE)
    for count, (path, ref) in enumerate(_refs(schema, "")):
        if count >= MAX_SCHEMA_REFS:
            found.append(FieldProblem(field, f"more than {MAX_SCHEMA_REFS} $ref; simplify the schema"))
            break
        if not ref.startswith("#"):
            found.append(FieldProblem(field, f"$ref {ref!r} at {path or '/'} points outside the schema; "
                                      "only local references (#/$defs/...) are allowed"))  # fmt: skip
            continue
        try:
            resolver.lookup(ref)
        except Unresolvable:
            found.append(FieldProblem(field, f"$ref {ref!r} at {path or '/'} does not resolve inside the schema"))
    return found


def _refs(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key in ("$ref", "$dynamicRef"):
            ref = value.get(key)
            if isinstance(ref, str):
                yield path, ref
        for key, item in value.items():
            if key not in ("const", "enum", "default", "examples"):  # data, not schemas
                yield from _refs(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _refs(item, f"{path}/{index}")


_DATA = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are data, not schemas."""
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""Keywords whose values map names (not keywords) to schemas."""


def _pattern_problems(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from _pattern_problems(item, f"{path}/{index}")
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        at = f"{path}/{key}"
        if key == "pattern" and isinstance(value, str):
            why = pattern_problem(value)
            if why:
                yield at, why
        elif key in _NAMED and isinstance(value, dict):
            for name, item in value.items():
                why = pattern_problem(name) if key == "patternProperties" else None
                if why:
                    yield f"{at}/{name}", why
                yield from _pattern_problems(item, f"{at}/{name}")
        elif key not in _DATA:
            yield from _pattern_problems(value, at)


def readable(model: type[M], record: BaseModel, field: str = "") -> str:
    """The record's JSON, once `model` reads it back; InvalidRequest (422) naming the field otherwise.
    Writers store what this returns, so nothing is written that its reader would refuse."""
    raw = record.model_dump_json()
    try:
        model.model_validate_json(raw)
    except ValidationError as exc:
        problems = tuple(
            FieldProblem(".".join(p for p in (field, *(str(x) for x in e["loc"])) if p) or "body",
                         f"{e['msg']}: the result could not be stored (it would not read back)")
            for e in exc.errors(include_url=False)[:20]
        )  # fmt: skip
        detail = "; ".join(f"{p.field}: {p.message}" for p in problems)
        raise InvalidRequest(f"the change was refused and nothing was stored: {detail}", problems) from exc
    return raw


__all__ = ["MAX_SCHEMA_REFS", "readable", "schema_problems"]
