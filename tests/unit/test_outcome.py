"""The lifecycle's outcome step on its own: sandbox outcomes in, status, category and retryability
out, decided as a value and applied to the record as a change that touches nothing else (no Docker,
no Redis, no artifact store)."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.executions.outcome import decide
from execbox.executions.outputs import ProgramFiles
from execbox.executions.schemas import ExecutionError, Expect
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.sandbox.runtime import Limits, SandboxOutcome
from tests.unit.test_results import make_record

LIMITS = Limits(timeout_s=5, cpu=1, cpu_time_s=3, memory_mb=64, pids=16, disk_mb=8, output_bytes=1000)
TRACEBACK = "Traceback (most recent call last):\n  File \"/workspace/main.py\", line 1\nKeyError: 'k'\n"


def run(exit_code: int | None = 0, stderr: str = "", **kw: Any) -> SandboxOutcome:
    return SandboxOutcome(exit_code=exit_code, stdout=b"", stderr=stderr.encode(), stdout_total=0,
                      stderr_total=len(stderr), **kw)  # fmt: skip


FAILED, SUCCEEDED, CANCELLED = ExecutionStatus.FAILED, ExecutionStatus.SUCCEEDED, ExecutionStatus.CANCELLED
DENIAL = {"host": "example.com", "port": 443, "at": 1.0, "reason": "not in the allowlist"}


@pytest.mark.parametrize(
    ("sandbox", "files", "expect", "denials", "status", "category", "retryable"),
    [
        (run(0), ProgramFiles(), None, None, SUCCEEDED, None, None),
        (run(1, TRACEBACK), ProgramFiles(), None, None, FAILED, ErrorCategory.CODE_EXCEPTION, False),
        (run(3), ProgramFiles(), Expect(exit_code=3), None, SUCCEEDED, None, None),
        (run(0), ProgramFiles(), Expect(exit_code=3), None, FAILED, ErrorCategory.OUTPUT_INVALID, False),
        (run(137, timed_out=True), ProgramFiles(), None, None, FAILED, ErrorCategory.LIMIT_TIMEOUT, False),
        (run(137, cancelled=True), ProgramFiles(), None, None, CANCELLED, ErrorCategory.CANCELLED, False),
        (run(137, oom_killed=True), ProgramFiles(), None, None, FAILED, ErrorCategory.LIMIT_MEMORY, False),
        (run(0, stdout_truncated=True), ProgramFiles(), None, None, FAILED, ErrorCategory.LIMIT_OUTPUT, False),
        (run(None, launcher_fault="no report"), None, None, None, FAILED, ErrorCategory.SANDBOX_ERROR, True),
        (run(0, collect_error="engine gone"), ProgramFiles(), None, None, FAILED, ErrorCategory.SANDBOX_ERROR, True),
        (run(0), ProgramFiles(over_cap=True), None, None, FAILED, ErrorCategory.LIMIT_ARTIFACTS, False),
        (run(0), ProgramFiles(problems=["bad index"]), None, None, FAILED, ErrorCategory.OUTPUT_INVALID, False),
        (run(1), ProgramFiles(check={"message": "m"}), None, None, FAILED, ErrorCategory.CHECK_FAILED, False),
        (run(137, timed_out=True), ProgramFiles(check={"message": "m"}), None, None, FAILED,
         ErrorCategory.LIMIT_TIMEOUT, False),
        (run(1), ProgramFiles(), None, [DENIAL], FAILED, ErrorCategory.POLICY_NETWORK_DENIED, False),
        (run(0), ProgramFiles(), None, [DENIAL], SUCCEEDED, None, None),
        (run(137, cancelled=True), ProgramFiles(), None, [DENIAL], CANCELLED, ErrorCategory.CANCELLED, False),
    ],
)  # fmt: skip
def test_a_sandbox_outcome_decides_status_category_and_retryability(
    sandbox: SandboxOutcome,
    files: ProgramFiles | None,
    expect: Expect | None,
    denials: list[dict[str, object]] | None,
    status: ExecutionStatus,
    category: ErrorCategory | None,
    retryable: bool | None,
) -> None:
    outcome = decide(make_record(expect=expect), sandbox, files, LIMITS, "python", denials=denials)
    assert outcome.status is status
    assert (outcome.error.category if outcome.error else None) is category
    assert (outcome.error.retryable if outcome.error else None) is retryable


def test_a_service_fault_without_a_sandbox_outcome_is_its_own_error() -> None:
    fault = ExecutionError(category=ErrorCategory.SANDBOX_ERROR, message="engine down", retryable=True)
    outcome = decide(make_record(), None, None, LIMITS, failure=fault)
    assert (outcome.status, outcome.error) == (FAILED, fault)


def test_applying_an_outcome_twice_gives_the_same_record() -> None:
    """A WATCH/MULTI retry runs the change again on a freshly read record: it must land the same."""
    outcome = decide(make_record(), run(1, TRACEBACK), ProgramFiles(outputs={"n": 1}), LIMITS,
                     "python", finished_at=12.5)  # fmt: skip
    once, twice = make_record(), make_record()
    assert outcome.apply(once) is FAILED
    outcome.apply(twice)
    outcome.apply(twice)
    assert once == twice
    assert once.outputs == {"n": 1} and once.finished_at == 12.5 and once.timing.total_ms == 12500.0


def test_a_kernel_restart_is_noted_on_the_calls_error() -> None:
    outcome = decide(make_record(), run(1, TRACEBACK, kernel_restarted=True, session_note="the kernel died"),
                     ProgramFiles(), LIMITS, "python")  # fmt: skip
    record = make_record()
    outcome.apply(record)
    assert record.kernel_restarted and record.error is not None
    assert "the kernel died" in record.error.message and record.error.details["kernel_restarted"] is True
