"""Request validation, public views and trace context parsing."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import execbox.sandbox
from execbox.core.tracing import from_traceparent
from execbox.executions.schemas import EXECUTION_ID_PATTERN, ExecutionCreate
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import new_execution_id
from tests.unit.test_results import make_record


def test_execution_ids_are_prefixed_and_unguessable() -> None:
    import re

    ids = {new_execution_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(EXECUTION_ID_PATTERN, i) for i in ids)


@pytest.mark.parametrize(
    "body",
    [
        {"language": "python", "code": ""},
        {"language": "python", "code": " \t\n"},
        {"language": "", "code": "x"},
        {"language": "python", "code": "x", "env": {"EXECBOX_X": "1"}},
        {"language": "python", "code": "x", "env": {"A": "\x00"}},
        {"language": "python", "code": "x", "policy": {"cpu": 0}},
        {"language": "python", "code": "x", "policy": {"extra": 1}},
        {"language": "python", "code": "x", "labels": {"k" * 65: "v"}},
    ],
)
def test_invalid_requests_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ExecutionCreate.model_validate(body)


def test_public_view_hides_code_and_env() -> None:
    record = make_record(code="secret()", env={"TOKEN": "t"}, status=ExecutionStatus.QUEUED)
    public = record.public().model_dump()
    assert "code" not in public and "env" not in public and "transitions" not in public
    assert public["status"] == "queued"


def test_traceparent_is_continued() -> None:
    trace = from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert trace.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace.span_id != "00f067aa0ba902b7"  # our own span, child of the caller's
    assert trace.traceparent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    ],
)
def test_bad_traceparent_starts_new_trace(header: str | None) -> None:
    trace = from_traceparent(header)
    assert len(trace.trace_id) == 32 and set(trace.trace_id) != {"0"}


def test_sandbox_exports_are_pinned() -> None:
    assert sorted(execbox.sandbox.__all__) == [
        "ContainerInfo",
        "Runtime",
        "SandboxControl",
        "SandboxOutcome",
        "SandboxSpec",
    ]
