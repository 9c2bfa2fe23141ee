"""What the end of an attempt makes of a declared effect (the rules are execbox.executions.effects'):
mutations of the record that the store's transitions apply, in the lifecycle (a run ended, or its
status check did) and in the reaper (its worker was lost). A mutation may send the execution round
again (QUEUED): its caller queues its entry once the change is stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from execbox.executions.effects import MAX_ATTEMPTS, MAX_TAKES, Next, StatusCheck, holds, next_step
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, OutputsSpec
from execbox.executions.status import ErrorCategory, ExecutionStatus


def settle_uncertain(record: ExecutionRecord) -> ExecutionStatus:
    """A mutation for an attempt whose outcome is unknown (`record.error` says why; the attempt may
    be a status check's): what its declared effect calls for. QUEUED means it runs again in place
    (its code, or first its status check); the caller queues its entry once the change is stored."""
    strategy = record.idempotency.strategy if record.idempotency else None
    step = next_step(record.effect, strategy, record.code_runs, record.session is not None)
    if step in (Next.RETRY, Next.STATUS_READ) and record.attempt >= MAX_TAKES:
        step = Next.UNKNOWN if step is Next.STATUS_READ else Next.FAIL
    if step in (Next.RETRY, Next.STATUS_READ):
        record.phase = "status_read" if step is Next.STATUS_READ else None
        record.started_at = None
        return queued_again(record)
    if step is Next.UNKNOWN:
        record.side_effects, record.phase = "unknown", None
        if record.error is not None:
            record.error = record.error.model_copy(update={"retryable": False})
        return ExecutionStatus.UNKNOWN_OUTCOME
    if record.effect == "write":
        record.side_effects = "possible"
    return ExecutionStatus.FAILED


def queued_again(record: ExecutionRecord) -> ExecutionStatus:
    """Queued (again, or once approved), with a queue deadline of its own from now."""
    record.queue_deadline = time.time() + record.policy.queue_timeout_s
    return ExecutionStatus.QUEUED


UNCERTAIN = {ErrorCategory.OUTCOME_UNKNOWN, ErrorCategory.SANDBOX_ERROR}
"""Failures after which a declared effect may or may not have happened (the code said so, or the
service failed around the run)."""


def after_run(
    apply: Callable[[ExecutionRecord], ExecutionStatus], check: StatusCheck | None, record: ExecutionRecord
) -> ExecutionStatus:
    """A mutation: the run's outcome applied to the record (`apply`), then what its declared effect
    makes of it (the run was `check`'s when given)."""
    prior = record.error
    status = apply(record)
    if check is not None:
        return _checked(record, check, status, prior)
    if status is ExecutionStatus.FAILED and record.effect is not None:
        if record.error is not None and record.error.category in UNCERTAIN:
            return settle_uncertain(record)
        if record.effect == "write":
            record.side_effects = "possible"
    return status


def _checked(
    record: ExecutionRecord, check: StatusCheck, status: ExecutionStatus, prior: ExecutionError | None
) -> ExecutionStatus:
    """A status check ended: the effect happened (succeeded, with the check's outputs), it did not
    (run the code again, with its key, while attempts are left), or the check could not tell."""
    record.phase = None
    why = prior.message if prior is not None else "its outcome was unknown"
    verdict = holds(check.expect, record.outputs) if status is ExecutionStatus.SUCCEEDED else None
    if verdict:
        record.side_effects, record.reconciled = None, f"{check.name}: the effect happened ({why})"
        return status
    if verdict is False:
        record.outputs, record.reconciled = {}, f"{check.name}: the effect did not happen ({why})"
        if record.code_runs < MAX_ATTEMPTS:
            return queued_again(record)
        record.side_effects = "none"
        record.error = ExecutionError(
            category=prior.category if prior else ErrorCategory.OUTCOME_UNKNOWN,
            message=f"{check.name}: the effect did not happen, and its {MAX_ATTEMPTS} attempts are used; {why}",
            retryable=True,
        )
        return ExecutionStatus.FAILED
    found = record.error.message if record.error else status.value
    record.side_effects = "unknown"
    record.error = ExecutionError(
        category=prior.category if prior else ErrorCategory.OUTCOME_UNKNOWN,
        message=f"{check.name} could not tell whether the effect happened ({found}); {why}; reconcile it",
        retryable=False,
        details={"status_check": found[:1000]},
    )
    return ExecutionStatus.UNKNOWN_OUTCOME


def checking(record: ExecutionRecord, check: StatusCheck) -> ExecutionRecord:
    """The record as its status check runs: the check's code and language, the execution's inputs,
    files, environment and key; no expectations or output globs of the code's."""
    return record.model_copy(
        update={"code": check.code, "language": check.language, "expect": None, "outputs_spec": OutputsSpec()}
    )


def approval_decided(tenant: str, approved: bool, why: str) -> Callable[[ExecutionRecord], ExecutionStatus | None]:
    """A mutation of an execution awaiting approval: queued (approved), failed without running
    (rejected, `why`), or expired when decided past its deadline (the sweep may lag)."""

    def decide(record: ExecutionRecord) -> ExecutionStatus | None:
        if record.tenant != tenant:
            return None
        if time.time() >= record.queue_deadline:
            return mark_expired_if_due(record)
        if approved:
            return queued_again(record)
        record.error = ExecutionError(category=ErrorCategory.APPROVAL_REJECTED, message=why, retryable=False)
        record.side_effects = "none" if record.effect == "write" else None
        return ExecutionStatus.FAILED

    return decide


def reconciled(applied: bool, outputs: dict[str, Any], reason: str) -> Callable[[ExecutionRecord], ExecutionStatus]:
    """A mutation of an unknown outcome, from the caller's evidence: succeeded (applied, with
    `outputs`) or failed (not applied: submit again, with the same key, to run it again)."""

    def settle(record: ExecutionRecord) -> ExecutionStatus:
        record.reconciled = f"{'applied' if applied else 'not_applied'}: {reason}"
        record.side_effects = None if applied else "none"
        if applied:
            record.outputs, record.error = outputs, None
            return ExecutionStatus.SUCCEEDED
        if record.error is not None:
            record.error = record.error.model_copy(update={"message": f"reconciled as not applied: {reason}"})
        return ExecutionStatus.FAILED

    return settle


def mark_expired_if_due(record: ExecutionRecord) -> ExecutionStatus | None:
    """A mutation: expired when the queued record's deadline has passed, otherwise unchanged."""
    if time.time() < record.queue_deadline:
        return None
    if record.code_runs > 0 and record.effect == "write":  # queued again after an uncertain attempt
        keyed = record.idempotency is not None and record.idempotency.strategy == "key"
        record.error = ExecutionError(
            category=ErrorCategory.EXPIRED,
            message="its code ran before (with an unknown outcome) and it was queued again, but no worker started "
            "it again before its deadline: its effect may have happened"
            + ("; submit again with the same key" if keyed else "; reconcile it"),
            retryable=keyed,
            details={"code_runs": record.code_runs},
        )
        record.side_effects, record.phase = ("possible" if keyed else "unknown"), None
        return ExecutionStatus.FAILED if keyed else ExecutionStatus.UNKNOWN_OUTCOME
    if record.status is ExecutionStatus.AWAITING_APPROVAL:
        record.error = ExecutionError(
            category=ErrorCategory.APPROVAL_EXPIRED,
            message=f"its approval {record.approval_id} was not decided before it expired; nothing ran; "
            "submit again to ask anew",
            retryable=False,
        )
        record.side_effects = "none" if record.effect == "write" else None
        return ExecutionStatus.EXPIRED
    record.error = ExecutionError(
        category=ErrorCategory.EXPIRED,
        message=f"no worker started it within its queue deadline of {record.policy.queue_timeout_s:g} s; "
        "submit again, or raise policy.queue_timeout_s",
        retryable=True,
    )
    return ExecutionStatus.EXPIRED
