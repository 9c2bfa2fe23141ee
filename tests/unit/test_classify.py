"""Outcome classification from raw run outcomes (no Docker)."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.executions.classify import classify, signal_name
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.sandbox.runtime import Limits, SandboxOutcome

LIMITS = Limits(timeout_s=5, cpu=1, cpu_time_s=3, memory_mb=64, pids=16, disk_mb=8, output_bytes=1000)


def outcome(exit_code: int | None = 0, stderr: str = "", **kw: Any) -> SandboxOutcome:
    return SandboxOutcome(
        exit_code=exit_code, stdout=b"", stderr=stderr.encode(), stdout_total=0, stderr_total=len(stderr), **kw
    )


def category(result: SandboxOutcome, language: str = "python") -> ErrorCategory | None:
    verdict = classify(result, language, LIMITS)
    return verdict.error.category if verdict.error else None


def test_success() -> None:
    verdict = classify(outcome(0), "python", LIMITS)
    assert verdict.status is ExecutionStatus.SUCCEEDED and verdict.error is None


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (outcome(137, timed_out=True), ErrorCategory.LIMIT_TIMEOUT),
        (outcome(137, cancelled=True, timed_out=True), ErrorCategory.CANCELLED),
        (outcome(137, stdout_truncated=True), ErrorCategory.LIMIT_OUTPUT),
        (outcome(137, oom_killed=True), ErrorCategory.LIMIT_MEMORY),
        (outcome(152), ErrorCategory.LIMIT_CPU),
        (outcome(137, run_ms=3500), ErrorCategory.LIMIT_CPU),
        (outcome(153), ErrorCategory.LIMIT_DISK),
        (outcome(2), ErrorCategory.CODE_EXIT_NONZERO),
        (outcome(139), ErrorCategory.CODE_EXIT_NONZERO),
    ],
)
def test_engine_signals_decide_first(result: SandboxOutcome, expected: ErrorCategory) -> None:
    assert category(result) is expected


def test_timeout_wins_over_output_written_before_it() -> None:
    assert category(outcome(137, timed_out=True, stdout_truncated=True)) is ErrorCategory.LIMIT_TIMEOUT


def test_python_exception_details() -> None:
    stderr = "Traceback (most recent call last):\n  File \"/workspace/main.py\", line 1, in <module>\nKeyError: 'k'\n"
    verdict = classify(outcome(1, stderr), "python", LIMITS)
    assert verdict.error is not None and verdict.error.category is ErrorCategory.CODE_EXCEPTION
    assert verdict.error.details["type"] == "KeyError" and verdict.error.details["message"] == "'k'"


def test_python_dotted_exception_type() -> None:
    stderr = 'Traceback (most recent call last):\n  File "x", line 1\njson.decoder.JSONDecodeError: Expecting value\n'
    verdict = classify(outcome(1, stderr), "python", LIMITS)
    assert verdict.error is not None and verdict.error.details["type"] == "json.decoder.JSONDecodeError"


def test_python_syntax_error() -> None:
    stderr = '  File "/workspace/main.py", line 1\n    def (\n        ^\nSyntaxError: invalid syntax\n'
    assert category(outcome(1, stderr)) is ErrorCategory.CODE_SYNTAX


def test_python_fork_failure_is_pids() -> None:
    stderr = "Traceback (most recent call last):\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n"
    assert category(outcome(1, stderr)) is ErrorCategory.LIMIT_PIDS


def test_python_disk_full() -> None:
    stderr = "Traceback (most recent call last):\nOSError: [Errno 28] No space left on device\n"
    assert category(outcome(1, stderr)) is ErrorCategory.LIMIT_DISK


def test_plain_stderr_without_traceback_is_exit_nonzero() -> None:
    assert category(outcome(1, "ValueError: printed, not raised\n")) is ErrorCategory.CODE_EXIT_NONZERO


def test_javascript_exception_and_syntax() -> None:
    thrown = "/workspace/main.js:1\nthrow new TypeError('x')\n^\n\nTypeError: x\n    at Object.<anonymous>\n"
    assert category(outcome(1, thrown), "javascript") is ErrorCategory.CODE_EXCEPTION
    syntax = "/workspace/main.js:1\nfunction (\n         ^\n\nSyntaxError: Function statements require a name\n"
    assert category(outcome(1, syntax), "javascript") is ErrorCategory.CODE_SYNTAX


def test_bash_syntax_and_fork() -> None:
    syntax = "main.sh: line 1: syntax error near unexpected token `then'\n"
    assert category(outcome(2, syntax), "bash") is ErrorCategory.CODE_SYNTAX
    fork = "main.sh: fork: retry: Resource temporarily unavailable\n"
    assert category(outcome(254, fork), "bash") is ErrorCategory.LIMIT_PIDS


def test_signal_names() -> None:
    assert signal_name(137) == "SIGKILL" and signal_name(143) == "SIGTERM"
    assert signal_name(1) is None and signal_name(None) is None and signal_name(255) is None
