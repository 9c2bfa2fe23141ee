"""Approval gates: an approval is requested when a gated step could start (or when an execution
that asks for one is accepted), and decided by a client; one left unanswered past `expires_at`
counts as expired when the run is next advanced (or the execution's deadline passes).

An approval shows everything that runs because of it (control C52): the code and its inputs, the
environment's names (values as digests), stdin's and each file's size and digest, the network and
policy, and the checks and compensation that run with it. It ends with its subject: a pending
approval whose run ended or whose execution was cancelled or is gone reads `withdrawn` (an
execution past its deadline `expired`), and deciding it answers 409 naming why. A key whose writes
need approval (the operator's policy, KeyInfo.require_approval) gets a gate on every step and
execution with side effects, asked for or not, and decides none itself.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from execbox.catalog.schemas import NetworkAllowlist, PolicyRequest
from execbox.executions.effects import REQUIRED_BY as REQUIRED_BY  # what its approvals say asked for them
from execbox.executions.effects import Approval
from execbox.executions.record import ExecutionRecord
from execbox.executions.status import ExecutionStatus
from execbox.files.blobs import ArtifactStore
from execbox.files.store import FileStore
from execbox.library.schemas import ScriptVersion
from execbox.plans import compensation, fallback
from execbox.plans.errors import ApprovalForbidden, RunConflict
from execbox.plans.refs import artifact_path, refs_in
from execbox.plans.schemas import (
    ApprovalPublic,
    ApprovalStatus,
    CodeCell,
    ScriptRef,
    Shown,
    ShownCode,
    ShownFile,
    StepSpec,
    StepState,
    StoredRun,
)
from execbox.plans.store import RunStore, new_id

GATED_KEY = (
    "this API key's writes need approval (the operator's policy), so it may decide no approval, start no "
    "compensation and retry no write; ask someone with a key without that restraint"
)


def has_effects(spec: StepSpec, state: StepState) -> bool:
    """Whether what the step runs now may change the world: a declared write, network access, a
    compensation, or a script (whose registered policy may reach the network)."""
    what, _, policy = fallback.what_runs(spec, state)
    reaches = isinstance(policy.network, NetworkAllowlist)
    return spec.effect == "write" or reaches or spec.compensation is not None or isinstance(what, ScriptRef)


def gate(run: StoredRun, step_id: str) -> Approval | None:
    """The approval the step must get before it runs: the plan's, or the operator's policy's (a key
    whose writes need approval added it, and it has side effects); None when it runs ungated."""
    spec, state = run.spec(step_id), run.steps[step_id]
    if spec.approval is not None and spec.approval.required:
        return spec.approval
    if state.approval_required and spec.input is None and has_effects(spec, state):
        expires = spec.approval.expires_in_s if spec.approval is not None else Approval().expires_in_s
        return Approval(summary=f"step {step_id}", expires_in_s=expires)
    return None


def gated(run: StoredRun, step_id: str) -> bool:
    """Whether running the step again (a compensation, a retry) is a decider's to allow."""
    spec, state = run.spec(step_id), run.steps[step_id]
    return (spec.approval is not None and spec.approval.required) or state.approval_required


def refusal(by: list[str], key_id: str, key_gated: bool) -> str | None:
    """Why API key `key_id` may not decide an approval naming `by` (empty: any key), or None."""
    if key_gated:
        return GATED_KEY
    if by and key_id not in by:
        return "it names the API keys that may decide it; this key is not one"
    return None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def step_shown(
    run: StoredRun,
    step_id: str,
    state: StepState,
    files: list[ShownFile],
    required_by: str | None,
    script: ScriptVersion | None = None,
) -> Shown:
    """What runs with the step besides its code and arguments (files already described by the executor;
    `script`: the version a `script:` run names now, whose policy applies unless the step gives one)."""
    spec = run.spec(step_id)
    what, _, policy = fallback.what_runs(spec, state)
    if script is not None and policy == PolicyRequest():
        policy = script.default_policy
    also = [ShownCode(role="precondition", name=c.name, language=c.run.language, code=c.run.code, args=c.args)
            for c in (spec.preconditions if fallback.active(spec, state) is None else [])]  # fmt: skip
    check = spec.idempotency.status_check if spec.idempotency is not None else None
    if check is not None:
        also.append(ShownCode(role="status_check", name=check.name, language=check.run.language,
                              code=check.run.code, args=check.args))  # fmt: skip
    if spec.compensation is not None:
        undo = spec.compensation
        also.append(ShownCode(role="compensation", language=undo.run.language, code=undo.run.code, args=undo.args))
    return Shown(
        language=what.language if isinstance(what, CodeCell) else script.language if script else None, files=files,
        network=policy.network or "none", policy=policy.name or "default", also_runs=also, required_by=required_by,
    )  # fmt: skip


def request(
    store: RunStore, run: StoredRun, step_id: str, state: StepState, now: float, shown: Shown, script_code: str | None
) -> ApprovalPublic:
    """A pending approval for the step, showing its resolved arguments, the code that will run (its
    own, or its fallback's, which is asked for again, or the script's as registered) and `shown`."""
    spec = run.spec(step_id)
    wanted = gate(run, step_id)
    assert wanted is not None
    what = fallback.what_runs(spec, state)[0]
    code = what.code if isinstance(what, CodeCell) else f"# the script {what.script}\n{script_code or ''}"
    summary = wanted.summary
    if spec.fallback is not None and fallback.active(spec, state) is not None:
        summary = f"{summary} (its fallback {spec.fallback.name}, after: {state.error.message if state.error else ''})"
    if state.attempts and state.reconciled:
        summary = f"{summary} (run again after a reconcile: {state.reconciled})"
    approval = ApprovalPublic(
        id=new_id("apr_"), run_id=run.id, step_id=step_id, status=ApprovalStatus.PENDING,
        summary=summary[:1000], args=state.args or {}, code=code, requested_at=now,
        expires_at=now + wanted.expires_in_s, tenant=run.tenant, by=wanted.by, **dict(shown),
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


def run_ended(run: StoredRun | None) -> str | None:
    """Why a pending approval of this run can no longer be decided (its run is gone or ended), or None.
    A step's own state is not read: its approval is stored just before the run, so outside the run's
    lock a new approval's step may still read as not waiting."""
    if run is None:
        return "its run is gone (past its retention)"
    if run.status.terminal:
        return f"its run ended as {run.status.value}" + (f" ({run.stop_reason})" if run.stop_reason else "")
    return None


def execution_ended(record: ExecutionRecord | None, now: float) -> tuple[ApprovalStatus, str] | None:
    """How a pending approval of this execution ends when the execution no longer waits for it (None:
    it still does, or a decision moved it and that decision, repeated, records itself)."""
    if record is None:
        return ApprovalStatus.WITHDRAWN, "its execution is gone (past its retention)"
    if record.status is ExecutionStatus.AWAITING_APPROVAL:
        return (ApprovalStatus.EXPIRED, "nobody decided it before it expired") if now >= record.queue_deadline else None
    left = record.transitions[1].status if len(record.transitions) > 1 else None  # what it left the wait for
    if left is ExecutionStatus.EXPIRED:
        return ApprovalStatus.EXPIRED, "nobody decided it before it expired"
    if left is ExecutionStatus.CANCELLED:
        return ApprovalStatus.WITHDRAWN, "its execution was cancelled before anyone decided"
    return None


def as_now(
    store: RunStore,
    approval: ApprovalPublic,
    execution: Callable[[str], ExecutionRecord | None],
    run: Callable[[str], StoredRun | None],
) -> ApprovalPublic:
    """The approval as it stands now: a pending one whose subject no longer waits for it is closed,
    saying why: withdrawn (its run ended or is gone, its execution was cancelled or is gone) or
    expired. `execution` reads an execution's record, `run` a run (a listing reads each run once)."""
    if approval.status is not ApprovalStatus.PENDING:
        return approval
    now = time.time()
    if approval.execution_id is not None:
        ended = execution_ended(execution(approval.execution_id), now)
    else:
        why = run_ended(run(approval.run_id or ""))
        expired = (
            (ApprovalStatus.EXPIRED, "nobody decided it before it expired") if now >= approval.expires_at else None
        )
        ended = (ApprovalStatus.WITHDRAWN, why) if why else expired
    if ended is not None:
        close(store, approval, ended[0], ended[1], now)
    return approval


def still_open(approval: ApprovalPublic) -> None:
    """RunConflict (409) naming why, unless the approval still waits for a decision."""
    if approval.status is not ApprovalStatus.PENDING:
        why = f": {approval.reason}" if approval.reason and approval.status is not ApprovalStatus.APPROVED else ""
        raise RunConflict(f"approval {approval.id} is already {approval.status.value}{why}")


def may_undo(run: StoredRun, key_id: str, key_gated: bool, field: str | None) -> None:
    """ApprovalForbidden unless API key `key_id` may start the compensation of every gated step it
    would undo: the code it runs was never what an approver decided on, so it is a decider's to ask."""
    for step_id in compensation.left_to_undo(run):
        if not gated(run, step_id) and not key_gated:
            continue
        wanted = run.spec(step_id).approval
        why = refusal(wanted.by if wanted is not None else [], key_id, key_gated)
        if why is not None:
            message = f"step {step_id}'s compensation is for a key that may decide its approval to start: {why}"
            raise ApprovalForbidden(run.steps[step_id].approval_id or step_id, field or f"steps.{step_id}", message)


def close(store: RunStore, approval: ApprovalPublic, status: ApprovalStatus, why: str, now: float) -> None:
    approval.status, approval.decided_at, approval.reason = status, now, why
    store.put_approval(approval)


@dataclass(frozen=True)
class ExecutionGate:
    """The approvals of executions, kept beside the runs' (execbox.executions.submit.Gate)."""

    store: RunStore
    clock: Callable[[], float] = time.time

    def new_id(self) -> str:
        return new_id("apr_")

    def request(self, record: ExecutionRecord, approval: Approval, required_by: str | None = None) -> None:
        assert record.approval_id is not None
        stdin = base64.b64decode(record.stdin_b64)
        also = []
        check = record.idempotency.status_check if record.idempotency is not None else None
        if check is not None:
            also.append(ShownCode(role="status_check", name=check.name, language=check.language, code=check.code))
        inputs = record.inputs
        self.store.put_approval(ApprovalPublic(
            id=record.approval_id, execution_id=record.id, status=ApprovalStatus.PENDING, summary=approval.summary,
            args=inputs if isinstance(inputs, dict) else {}, code=record.code, requested_at=self.clock(),
            expires_at=record.queue_deadline, tenant=record.tenant, by=approval.by, language=record.language,
            inputs=None if isinstance(inputs, dict) else inputs,
            env_sha256={name: digest(value.encode()) for name, value in sorted(record.env.items())},
            stdin_bytes=len(stdin), stdin_sha256=digest(stdin) if stdin else None,
            files=[ShownFile(path=f.path, size=f.size, sha256=f.sha256, source=f.file_id) for f in record.files],
            network=record.policy.network, policy=record.policy.name, also_runs=also, required_by=required_by,
        ))  # fmt: skip


def step_files(
    run: StoredRun, step_id: str, state: StepState, files: FileStore, artifacts: ArtifactStore
) -> list[ShownFile]:
    """The step's input files, as its approval shows them: inline ones and uploads with their size
    and digest, and each earlier step's artifact its arguments pass (read and digested now)."""
    spec = run.spec(step_id)
    shown = []
    for given in spec.files:
        if given.content_b64 is not None:
            try:
                data = base64.b64decode(given.content_b64)
            except ValueError:  # refused when it is dispatched
                shown.append(ShownFile(path=given.path, source="inline"))
                continue
            shown.append(ShownFile(path=given.path, size=len(data), sha256=digest(data), source="inline"))
        else:
            meta = files.meta(given.file_id or "")
            size, sha = (meta.size, meta.sha256) if meta is not None else (None, None)
            shown.append(ShownFile(path=given.path, size=size, sha256=sha, source=given.file_id or ""))
    for ref in refs_in(fallback.what_runs(spec, state)[1]):
        if ref.kind != "artifact":
            continue
        producer = run.steps[ref.pointer[1]]
        source = f"step {ref.pointer[1]}'s artifact {ref.pointer[3]}"
        try:
            hasher, size = hashlib.sha256(), 0
            for chunk in artifacts.read(producer.attempts[-1], ref.pointer[3]):
                hasher.update(chunk)
                size += len(chunk)
        except (FileNotFoundError, IndexError):  # missing: the dispatch fails the step (input.invalid)
            shown.append(ShownFile(path=artifact_path(ref), source=source))
            continue
        shown.append(ShownFile(path=artifact_path(ref), size=size, sha256=hasher.hexdigest(), source=source))
    return shown
