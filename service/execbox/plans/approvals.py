"""Approval gates: an approval is requested when a gated step could start (or when an execution
that asks for one is accepted), and decided by a client; one left unanswered past `expires_at`
counts as expired when the run is next advanced (or the execution's deadline passes)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from execbox.executions.effects import Approval
from execbox.executions.record import ExecutionRecord
from execbox.plans import fallback
from execbox.plans.schemas import ApprovalPublic, ApprovalStatus, CodeCell, StepState, StoredRun
from execbox.plans.store import RunStore, new_id


def request(store: RunStore, run: StoredRun, step_id: str, state: StepState, now: float) -> ApprovalPublic:
    """A pending approval for the step, showing its resolved arguments and the code that will run:
    its own, or its fallback's (which is asked for again), or the script it names."""
    spec = run.spec(step_id)
    assert spec.approval is not None
    what = fallback.what_runs(spec, state)[0]
    code = what.code if isinstance(what, CodeCell) else f"# the script {what.script}, as registered in the library"
    summary = spec.approval.summary
    if spec.fallback is not None and fallback.active(spec, state) is not None:
        summary = f"{summary} (its fallback {spec.fallback.name}, after: {state.error.message if state.error else ''})"
    approval = ApprovalPublic(
        id=new_id("apr_"), run_id=run.id, step_id=step_id, status=ApprovalStatus.PENDING,
        summary=summary[:1000], args=state.args or {}, code=code, requested_at=now,
        expires_at=now + spec.approval.expires_in_s, tenant=run.tenant, by=spec.approval.by,
    )  # fmt: skip
    store.put_approval(approval)
    return approval


def current(store: RunStore, approval_id: str, now: float) -> ApprovalPublic | None:
    """The approval as it stands now: a pending one past its expiry is recorded as expired."""
    approval = store.approval(approval_id)
    if approval is not None and approval.status is ApprovalStatus.PENDING and now >= approval.expires_at:
        approval.status, approval.decided_at = ApprovalStatus.EXPIRED, now
        store.put_approval(approval)
    return approval


@dataclass(frozen=True)
class ExecutionGate:
    """The approvals of executions, kept beside the runs' (execbox.executions.submit.Gate)."""

    store: RunStore

    def new_id(self) -> str:
        return new_id("apr_")

    def request(self, record: ExecutionRecord, approval: Approval) -> None:
        assert record.approval_id is not None
        now = time.time()
        self.store.put_approval(ApprovalPublic(
            id=record.approval_id, execution_id=record.id, status=ApprovalStatus.PENDING, summary=approval.summary,
            args=record.inputs if isinstance(record.inputs, dict) else {}, code=record.code, requested_at=now,
            expires_at=record.queue_deadline, tenant=record.tenant, by=approval.by,
        ))  # fmt: skip
