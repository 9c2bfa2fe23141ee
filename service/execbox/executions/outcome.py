"""The outcome step of an execution's life: what its run came to, decided as a value, then applied.

`decide` is pure: from the sandbox's SandboxOutcome (or the service fault that stopped it), the
program's files already read (`executions.outputs`), the limits and the language's error rules,
it returns an `Outcome`: status, error, streams, artifacts, outputs, checks, network report.
`Outcome.apply` is the change the terminal transition makes to the stored record; it reads and
writes nothing but the record, so a WATCH/MULTI retry may run it again at no cost.

What the program wrote and what the client asked for (`expect.outputs_schema`) can be anything:
whatever is wrong with them is the execution's outcome (`output.invalid`, not retryable).
"""

from __future__ import annotations

import base64
import fnmatch
from dataclasses import dataclass
from typing import Any

from execbox.catalog.languages import ErrorRules
from execbox.core.schemacheck import schema_errors
from execbox.executions.classify import classify
from execbox.executions.outputs import ProgramFiles
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, NetworkDenial, NetworkReport, Resources, Timing
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.sandbox.runtime import Limits, SandboxOutcome

_STOPPED_FROM_OUTSIDE = {
    ErrorCategory.CANCELLED,
    ErrorCategory.LIMIT_TIMEOUT,
    ErrorCategory.LIMIT_OUTPUT,
    ErrorCategory.LIMIT_MEMORY,
    ErrorCategory.LIMIT_CPU,
}


@dataclass(frozen=True)
class Outcome:
    """An execution's result, before it is stored."""

    status: ExecutionStatus
    error: ExecutionError | None
    run: SandboxOutcome | None = None
    """None: the sandbox never gave an outcome (a service fault, in `error`)."""
    signal: str | None = None
    files: ProgramFiles | None = None
    network: NetworkReport | None = None
    """Set only under an allowlist policy (its refusals, possibly none)."""
    finished_at: float | None = None

    def apply(self, record: ExecutionRecord) -> ExecutionStatus:
        """Fill the record with this outcome and give the status it moves to (the transition's
        mutation)."""
        run = self.run
        if run is not None:
            record.exit_code = run.exit_code
            record.signal = self.signal
            record.stdout, record.stdout_encoding = decode_stream(run.stdout, run.stdout_truncated)  # type: ignore[assignment]
            record.stderr, record.stderr_encoding = decode_stream(run.stderr, run.stderr_truncated)  # type: ignore[assignment]
            record.stdout_bytes, record.stderr_bytes = run.stdout_total, run.stderr_total
            record.stdout_truncated, record.stderr_truncated = run.stdout_truncated, run.stderr_truncated
            record.image = run.image_id
            record.resources = Resources(peak_memory_bytes=run.peak_memory_bytes, oom_killed=run.oom_killed)
            record.timing = Timing(
                queue_wait_ms=record.timing.queue_wait_ms,
                sandbox_start_ms=round(run.start_ms, 1),
                warm_start=run.warm,
                run_ms=round(run.run_ms, 1),
                collect_ms=round(run.collect_ms, 1),
            )
            if run.kernel_restarted:
                record.kernel_restarted = True
        if self.files is not None:
            record.artifacts = list(self.files.artifacts)
            record.artifacts_not_kept = list(self.files.not_kept)
            record.outputs = dict(self.files.outputs)
            record.results = list(self.files.results)
        if self.network is not None:
            record.network = self.network
        record.error = self.error
        if self.finished_at is not None:
            record.timing.total_ms = round((self.finished_at - record.created_at) * 1000, 1)
            record.finished_at = self.finished_at
        return self.status


def decide(
    record: ExecutionRecord,
    run: SandboxOutcome | None,
    files: ProgramFiles | None,
    limits: Limits,
    errors: ErrorRules | str | None = None,
    failure: ExecutionError | None = None,
    denials: list[dict[str, object]] | None = None,
    finished_at: float | None = None,
) -> Outcome:
    """The outcome of `record`'s run. `errors`: the language's error rules; `failure`: the service
    fault when there is no `run`; `denials`: the egress proxy's refusals (None: no allowlist)."""
    if run is None:
        status, error, signal = ExecutionStatus.FAILED, failure, None
    else:
        verdict = classify(run, errors or record.language, limits)
        signal = verdict.signal
        status, error = _judge(record, run, verdict.status, verdict.error, files)
        if run.kernel_restarted:
            error = note_restart(error, run)
    network = None
    if denials is not None:
        network = NetworkReport(denied=[NetworkDenial.model_validate(d) for d in denials])
        error = blame_network(error, network)
    return Outcome(status, error, run, signal, files, network, finished_at)


def _judge(
    record: ExecutionRecord,
    run: SandboxOutcome,
    status: ExecutionStatus,
    error: ExecutionError | None,
    files: ProgramFiles | None,
) -> tuple[ExecutionStatus, ExecutionError | None]:
    """Which of the run's findings is its outcome, in order: stopped from outside, the program's
    failed check, its failure, a failed collection, the artifact caps, unmet expectations."""
    failed = ExecutionStatus.FAILED
    category = error.category if error else None
    if category in _STOPPED_FROM_OUTSIDE:
        return status, error
    check = files.check if files is not None else None
    if check is not None:
        message = str(check.get("message", ""))[:4000]
        details = check.get("details") if isinstance(check.get("details"), dict) else {}
        if check.get("outcome_unknown") is True:  # execbox.outcome_unknown(reason): the code cannot tell
            return failed, ExecutionError(
                category=ErrorCategory.OUTCOME_UNKNOWN,
                message=f"the code could not tell whether its effect happened: {message}",
                retryable=False,
                details={"reason": message},
            )
        return failed, _error(ErrorCategory.CHECK_FAILED, f"check failed: {message}", message=message,
                              details=details)  # fmt: skip
    expected_exit = record.expect is not None and record.expect.exit_code == run.exit_code
    if error is not None and not expected_exit:
        return failed, error
    if run.collect_error:
        return failed, ExecutionError(category=ErrorCategory.SANDBOX_ERROR, message=run.collect_error,
                                      retryable=True, details={"reason": "collect_failed"})  # fmt: skip
    if files is not None and files.over_cap:
        return failed, _error(
            ErrorCategory.LIMIT_ARTIFACTS,
            f"{len(files.passed_caps)} produced file(s) passed the artifact caps and were not kept; see "
            "artifacts_not_kept. Write fewer or smaller files, or raise policy.artifact_*",
            kept=files.kept,
            not_kept=files.passed_caps,
        )
    unmet = _unmet(record, run, files) + (files.problems if files is not None else [])
    if unmet:
        return failed, _error(ErrorCategory.OUTPUT_INVALID, "unmet expectations: " + "; ".join(unmet),
                              unmet=unmet)  # fmt: skip
    return ExecutionStatus.SUCCEEDED, None


def decode_stream(data: bytes, truncated: bool) -> tuple[str, str]:
    """(text, encoding): UTF-8 text when the bytes are UTF-8 (a character cut by the cap is
    dropped), else base64 of the exact bytes."""
    for cut in range(4 if truncated else 1):
        try:
            return data[: len(data) - cut].decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            continue
    return base64.b64encode(data).decode(), "base64"


def _error(category: ErrorCategory, text: str, **details: Any) -> ExecutionError:
    return ExecutionError(category=category, message=text, retryable=False, details=details)


def _unmet(record: ExecutionRecord, run: SandboxOutcome, files: ProgramFiles | None) -> list[str]:
    expect = record.expect
    if expect is None:
        return []
    unmet = []
    wanted_exit = expect.exit_code or 0
    if run.exit_code != wanted_exit:
        unmet.append(f"exit code was {run.exit_code}, expected {wanted_exit}")
    names = [a.name for a in (files.artifacts if files is not None else record.artifacts)]
    for pattern in expect.artifacts:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            unmet.append(f"no artifact matches {pattern!r}")
    if expect.outputs_schema is not None:
        outputs = files.outputs if files is not None else record.outputs
        try:
            problems = sorted(
                schema_errors(expect.outputs_schema, outputs), key=lambda e: [str(p) for p in e.absolute_path]
            )
        except Exception as exc:  # the client's schema (an unresolvable $ref, say): its outcome, not ours
            unmet.append(f"expect.outputs_schema cannot be applied ({type(exc).__name__}: {str(exc)[:300]})")
            return unmet
        for problem in problems:
            where = ".".join(str(p) for p in problem.absolute_path) or "(outputs)"
            unmet.append(f"outputs.{where}: {problem.message}" if where != "(outputs)" else problem.message)
    return unmet


def note_restart(error: ExecutionError | None, run: SandboxOutcome) -> ExecutionError | None:
    """A session's call after which the kernel was restarted, or the session was lost: its error
    says so."""
    if run.cancelled or error is None:
        return error  # the client's cancel (or its DELETE of the session) says enough
    if run.launcher_fault:
        note = f"the session ended ({run.launcher_fault}): its state is lost; open a new session"
        return error.model_copy(update={"message": note, "retryable": False})
    note = (run.session_note or "the kernel was restarted") + (
        "; the session goes on with a fresh interpreter: earlier variables and imports are gone, files in "
        "/workspace remain"
    )
    details = {**error.details, "kernel_restarted": True}
    return error.model_copy(update={"message": f"{error.message}. {note}", "details": details})


def blame_network(error: ExecutionError | None, network: NetworkReport) -> ExecutionError | None:
    """A run that failed after the egress proxy refused it something reports policy.network_denied
    (the refused hosts are in the record's network report; the original category stays in the details)."""
    if not network.denied or error is None:
        return error
    if error.category in (ErrorCategory.SANDBOX_ERROR, ErrorCategory.CANCELLED):
        return error
    hosts = sorted({f"{d.host}:{d.port}" for d in network.denied if d.host})
    return ExecutionError(
        category=ErrorCategory.POLICY_NETWORK_DENIED,
        message=f"the program failed after the egress proxy refused {', '.join(hosts) or 'a connection'}: "
        f"{error.message}",
        retryable=False,
        details={**error.details, "original_category": error.category.value},
    )
