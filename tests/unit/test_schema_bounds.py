"""Issue 44, finding 4, from a tenant's side: a JSON Schema's pattern runs on RE2, never on a
backtracking engine holding the interpreter lock, every schema check ends within its bound, and a
pattern RE2 cannot run (or an execution's `$ref` that does not resolve) is refused at submission."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from execbox.core.readable import schema_problems
from execbox.core.schemacheck import CHECK_S, is_valid, schema_errors
from execbox.executions.outcome import decide
from execbox.executions.outputs import ProgramFiles
from execbox.executions.schemas import Expect
from execbox.executions.status import ErrorCategory, ExecutionStatus
from tests.unit.conftest import InProcess
from tests.unit.test_outcome import LIMITS, run
from tests.unit.test_results import make_record

Api = tuple[InProcess, dict[str, dict[str, str]]]
EVIL = "^(a+)+$"
"""Python's re takes 2^n steps on n a's and a `!`: 1.9 s at 25, minutes at 32."""


def subject(length: int) -> str:
    return "a" * length + "!"


@pytest.mark.parametrize("length", [25, 32, 40])
@pytest.mark.parametrize(
    ("schema", "in_key", "holds"),
    [
        ({"pattern": EVIL}, False, False),
        ({"propertyNames": {"pattern": EVIL}}, True, False),
        ({"patternProperties": {EVIL: {"type": "string"}}}, True, True),  # not matched: not checked
        ({"patternProperties": {EVIL: {}}, "additionalProperties": False}, True, False),
        ({"allOf": [{"patternProperties": {EVIL: {}}}], "unevaluatedProperties": False}, True, False),
    ],
    ids=["pattern", "propertyNames", "patternProperties", "additionalProperties", "unevaluatedProperties"],
)
def test_a_backtracking_pattern_is_checked_in_milliseconds(
    schema: dict[str, Any], in_key: bool, holds: bool, length: int
) -> None:
    instance: Any = {subject(length): 1} if in_key else subject(length)
    started = time.perf_counter()

    errors = schema_errors(schema, instance)

    took = time.perf_counter() - started
    assert took < 0.05, f"{took:.3f} s: the pattern backtracked"
    assert bool(errors) is not holds, errors
    matching: Any = {"a" * length: "x"} if in_key else "a" * length
    assert is_valid(schema, matching) and not is_valid({**schema, "minLength": 10**6, "minProperties": 99}, matching)


def test_a_schema_exponential_without_any_pattern_ends_at_its_bound() -> None:
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    schema = {"$defs": {"n": {"oneOf": [branch, branch]}}, "$ref": "#/$defs/n"}
    deep: list[Any] = []
    for _ in range(40):  # 2^40 evaluations of both branches
        deep = [deep]
    started = time.perf_counter()

    errors = schema_errors(schema, deep, within_s=0.3)

    assert time.perf_counter() - started < 0.3 + 0.5
    assert len(errors) == 1 and "took more than 0.3 s" in errors[0].message
    assert not is_valid(schema, deep, within_s=0.3)
    assert CHECK_S <= 5, "the worker's expect check and every API check are bounded by this"


def test_unique_items_of_many_objects_are_compared_by_hash() -> None:
    items = [{"row": i} for i in range(20_000)]
    started = time.perf_counter()

    assert not schema_errors({"uniqueItems": True}, items)
    assert schema_errors({"uniqueItems": True}, [*items, {"row": 7}])
    assert time.perf_counter() - started < 5.0  # pairwise: 2e8 comparisons, minutes
    assert schema_errors({"uniqueItems": True}, [1, 1.0]) and not schema_errors({"uniqueItems": True}, [1, True])


def test_the_workers_expect_check_is_bounded_and_fails_the_run_not_the_worker() -> None:
    branch = {"type": "array", "items": {"$ref": "#/$defs/n"}}
    schema = {"type": "object", "$defs": {"n": {"oneOf": [branch, branch]}},
              "properties": {"word": {"pattern": EVIL}, "tree": {"$ref": "#/$defs/n"}}}  # fmt: skip
    deep: list[Any] = []
    for _ in range(40):
        deep = [deep]
    record = make_record(expect=Expect(outputs_schema=schema))
    started = time.perf_counter()

    outcome = decide(record, run(0), ProgramFiles(outputs={"word": subject(40), "tree": deep}), LIMITS, "python")

    assert time.perf_counter() - started < CHECK_S + 1.0, "the check ran past its bound"
    assert outcome.status is ExecutionStatus.FAILED and outcome.error is not None
    assert outcome.error.category is ErrorCategory.OUTPUT_INVALID, outcome.error
    assert "took more than" in outcome.error.message or "does not match" in outcome.error.message


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"pattern": "(?=a)b"}, "/pattern"),
        ({"properties": {"x": {"pattern": "(a)\\1"}}}, "/properties/x/pattern"),
        ({"patternProperties": {"(?<!x)y": {}}}, "/patternProperties/(?<!x)y"),
    ],
)
def test_a_pattern_re2_cannot_run_is_a_schema_problem(schema: dict[str, Any], where: str) -> None:
    (problem,) = schema_problems(schema, "input_schema")

    assert problem.field == "input_schema" and where in problem.message and "backtracking" in problem.message


def test_a_property_named_pattern_is_not_taken_for_the_keyword() -> None:
    assert schema_problems({"properties": {"pattern": {"type": "string"}}}, "f") == []


# -- through the API


def test_an_executions_expect_schema_is_refused_at_submission_naming_the_field(api: Api) -> None:
    http, as_ = api
    cell = {"language": "python", "code": "print(1)"}

    lookahead = http.post("/v1/executions", headers=as_["alpha"],
                          json={**cell, "expect": {"outputs_schema": {"pattern": "(?=a)"}}})  # fmt: skip
    unresolved = http.post("/v1/executions", headers=as_["alpha"],
                           json={**cell, "expect": {"outputs_schema": {"$ref": "#/$defs/missing"}}})  # fmt: skip

    for answer in (lookahead, unresolved):
        assert answer.status_code == 422, answer.text
        assert [e["field"] for e in answer.json()["errors"]] == ["expect.outputs_schema"], answer.text
    assert "does not resolve" in unresolved.json()["errors"][0]["message"]


SCRIPT = {
    "name": "checks.word", "version": "1.0.0", "language": "python", "code": "print(1)",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string", "pattern": EVIL}}},
}  # fmt: skip


def test_a_costly_pattern_does_not_hold_another_tenants_request(api: Api) -> None:
    http, as_ = api
    assert http.post("/v1/scripts", json=SCRIPT, headers=as_["alpha"]).status_code == 201
    invoke = {"version": "1.0.0", "inputs": {"word": subject(28)}}  # Python's re: about 15 s

    async def timed(call: Any) -> float:
        started = time.perf_counter()
        answer = await call
        assert answer.status_code < 500, answer.text
        return time.perf_counter() - started

    async def window() -> tuple[float, float, float]:
        baseline = min([await timed(http.http.get("/v1/runs", headers=as_["beta"])) for _ in range(3)])
        invoked, other = await asyncio.gather(
            timed(http.http.post("/v1/scripts/checks.word/invoke", json=invoke, headers=as_["alpha"])),
            timed(http.http.get("/v1/runs", headers=as_["beta"])),
        )
        return baseline, invoked, other

    baseline, invoked, other = http.run(window())

    assert invoked < 1.0, f"the invocation's input check took {invoked:.2f} s"
    assert other < baseline + 0.5, f"beta's GET /v1/runs took {other:.3f} s beside it (alone: {baseline:.3f} s)"
    refused = http.post("/v1/scripts/checks.word/invoke", json=invoke, headers=as_["alpha"])
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "inputs.word", refused.text
