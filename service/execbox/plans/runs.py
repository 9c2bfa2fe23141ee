"""What clients do to runs, without HTTP: create, cancel, revise, reconcile, decide, report usage,
read the hand-off. Each change happens under the run's lock and ends with one reconciliation.

Longer than 400 lines because every client action on a run is the same lock, change and reconcile
pattern, each with the key's rights checked (approvals, inputs, compensation), best read side by side.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.catalog.webhook_hosts import host_allowed
from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.core.readable import readable
from execbox.core.schemacheck import schema_errors
from execbox.core.tracing import from_traceparent
from execbox.executions.record import ExecutionRecord
from execbox.library.schemas import ScriptVersion
from execbox.plans import approvals, compensation, handoff, inputs, usage
from execbox.plans.errors import (
    ApprovalForbidden,
    ApprovalNotFound,
    InputForbidden,
    InvalidPlan,
    RunConflict,
    RunNotFound,
)
from execbox.plans.executor import Executor
from execbox.plans.handoff import Handoff
from execbox.plans.schemas import (
    ApprovalPublic,
    ApprovalStatus,
    CancelRequest,
    Decision,
    InputSupply,
    PlanDocument,
    ReconcileRequest,
    RevisionCreate,
    RunCreate,
    RunStatus,
    StepState,
    StepStatus,
    StoredRun,
)
from execbox.plans.store import new_id
from execbox.plans.usage import ModelCallReport
from execbox.plans.validation import problems

log = logging.getLogger(__name__)
RUN_OVERHEAD = 16 << 10
STEP_ALLOWANCE = 4 << 10
"""A run's storage charge: its plan as sent, and room for its state and each step's (ids, attempts, keys);
counted until its wall budget and the retention have passed, the longest it can be kept."""


@dataclass
class Runs:
    executor: Executor
    languages: Languages
    policies: PolicySet
    allowed_policies: Callable[[str], Collection[str]]
    """tenant -> the policy names it may use (Quotas.quota(tenant).policies)."""
    webhook_hosts: list[str]

    def validate(self, tenant: str, plan: PlanDocument) -> list[FieldProblem]:
        return problems(plan, self.languages, self.policies, self._allowed(tenant),
                        scripts=lambda ref: self._script(tenant, ref))  # fmt: skip

    def _script(self, tenant: str, ref: str) -> ScriptVersion | str:
        """The script `name@version` names now, or why there is none."""
        library = self.executor.scripts
        if library is None:
            return "this service has no script library"
        name, _, version = ref.partition("@")
        try:
            return library.resolve(tenant, name, version)
        except ServiceError as exc:
            return exc.message

    def create(self, tenant: str, body: RunCreate, traceparent: str | None, key_gated: bool = False) -> StoredRun:
        """Store and start a run; made with a key whose writes need approval (`key_gated`), each of its
        steps with side effects waits for an approval, asked for or not."""
        found = self.validate(tenant, body.plan)
        if body.webhook is not None and not host_allowed(body.webhook.url, self.webhook_hosts):
            found.append(FieldProblem("webhook.url", "host not allowed for callbacks (EXECBOX_WEBHOOKS__ALLOW_HOSTS)"))
        if found:
            raise InvalidPlan(tuple(found))
        quotas = self.executor.submissions.quotas
        quotas.admit_run(tenant)  # then its bytes, before any is stored: a refused run leaves nothing behind
        kept = len(body.plan.model_dump_json()) + RUN_OVERHEAD + STEP_ALLOWANCE * len(body.plan.steps)
        retention_s = self.executor.submissions.settings.retention_s
        quotas.keep(tenant, kept, body.plan.budgets.max_wall_s + retention_s, "this run")
        now = time.time()
        run = StoredRun(
            id=new_id("run_"), tenant=tenant, status=RunStatus.RUNNING, revision=1, objective=body.plan.objective,
            labels=body.labels, trace_id=from_traceparent(traceparent).trace_id, created_at=now,
            budgets=body.plan.budgets, plan=body.plan, inputs=body.plan.inputs, webhook=body.webhook,
            steps={s.id: StepState(revision=1, approval_required=key_gated) for s in body.plan.steps},
            queue=self.executor.queue,
        )  # fmt: skip
        self.executor.record(run, "run.created", None, run.status.value, f"{len(run.steps)} steps")
        self.executor.store.create(run)  # checked with the model that reads it back (422, nothing stored)
        # From here the run exists: the answer is 201 with the run as it stands, never a 500 for a
        # run that was kept. It is due now, so the plans consumer advances it if this cannot.
        try:
            return self.executor.advance(run.id) or run
        except ServiceError as exc:
            log.warning("run %s created; its first advance waits for the plans consumer: %s", run.id, exc.message)
            return run
        except Exception:
            log.exception("run %s: its first advance failed; the run is ended as failed", run.id)
            return self.executor.abandon(run.id, f"the service failed to start the run (trace {run.trace_id})") or run

    def get(self, tenant: str, run_id: str) -> StoredRun:
        run = self.executor.store.get(run_id)
        if run is None or run.tenant != tenant:
            raise RunNotFound(run_id)
        return run

    def cancel(
        self, tenant: str, run_id: str, body: CancelRequest | None = None, key_id: str = "", key_gated: bool = False
    ) -> StoredRun:
        """Stop a run; with `compensate`, then undo its succeeded writes (execbox.plans.compensation),
        which for a gated step only a key that may decide its approval can ask."""
        body = body or CancelRequest()
        with self._change(tenant, run_id) as run:
            if run.status.terminal:
                raise RunConflict(f"run {run_id} already ended as {run.status.value}")
            if body.compensate:
                approvals.may_undo(run, key_id, key_gated, "compensate")
            self.executor.stop(run, RunStatus.CANCELLED, "cancelled_by_client", body.reason)
            if body.compensate:
                undone = compensation.begin(run, body.reason, time.time())
                self.executor.record(run, "compensation.started", None, "running", f"{len(undone)} write(s) to undo")
        return run

    def compensate(self, tenant: str, run_id: str, reason: str, key_id: str = "", key_gated: bool = False) -> StoredRun:
        """Undo the run's succeeded writes: a run that has not ended is abandoned (cancelled) first;
        one whose compensation stopped resumes at the step that failed. Undoing a gated step runs code
        beyond what was approved: only a key that may decide its approval asks it (ApprovalForbidden)."""
        with self._change(tenant, run_id) as run:
            if compensation.running(run):
                raise RunConflict(f"run {run_id} is already being compensated")
            if run.status.terminal and not compensation.left_to_undo(run):
                raise RunConflict(f"run {run_id} has no succeeded write left to undo")
            approvals.may_undo(run, key_id, key_gated, None)
            if not run.status.terminal:
                self.executor.stop(run, RunStatus.CANCELLED, "abandoned", f"abandoned to be compensated: {reason}")
            undone = compensation.begin(run, reason, time.time())
            self.executor.record(run, "compensation.started", None, "running", f"{len(undone)} write(s) to undo")
        return run

    def revise(
        self, tenant: str, run_id: str, body: RevisionCreate, key_id: str | None = None, key_gated: bool = False
    ) -> StoredRun:
        """Apply a revision made with API key `key_id`: removing a step gated by an approval that
        names its deciders needs the right to decide it (ApprovalForbidden otherwise)."""
        with self._change(tenant, run_id) as run:
            if body.base_revision != run.revision:
                raise RunConflict(f"run {run_id} is at revision {run.revision}, not {body.base_revision}; "
                                  "read it again and revise against the current one")  # fmt: skip
            if not run.status.revisable:
                raise RunConflict(f"run {run_id} is {run.status.value}; only an unfinished run can be revised")
            replanning = run.status in (RunStatus.NEEDS_REPLAN, RunStatus.GOAL_FAILED)
            if replanning and run.usage.replans >= run.budgets.max_replans:
                self.executor.stop(run, RunStatus.FAILED, "replans_exhausted",
                                   f"max_replans {run.budgets.max_replans} reached")  # fmt: skip
                self.executor.save(run)
                raise RunConflict(f"run {run_id} used its {run.budgets.max_replans} re-plan(s); it is now failed")
            self._apply(tenant, run, body, replanning, key_id, key_gated)
        return run

    def reconcile(
        self, tenant: str, run_id: str, step_id: str, body: ReconcileRequest, key_gated: bool = False
    ) -> StoredRun:
        """Settle an unknown outcome. Run again (`retry`), a gated step asks a new approval that says
        so (the one given covered one run), as does any step with side effects that a key whose writes
        need approval (`key_gated`) has run again."""
        with self._change(tenant, run_id) as run:
            state = run.steps.get(step_id)
            if state is None or state.status is not StepStatus.UNKNOWN_OUTCOME:
                raise RunConflict(f"step {step_id!r} has no unknown outcome to settle")
            schema = run.spec(step_id).postconditions
            if body.outcome == "applied" and schema and schema.outputs_schema:
                errors = sorted(e.message for e in schema_errors(schema.outputs_schema, body.outputs))
                if errors:
                    raise InvalidPlan(tuple(FieldProblem("outputs", e) for e in errors))
            state.reconciled = f"{body.outcome}: {body.reason}"
            if body.outcome == "applied":
                state.outputs, state.side_effects = body.outputs, "none"
                self.executor.set_step(run, step_id, StepStatus.SUCCEEDED, f"reconciled as applied: {body.reason}")
            elif body.retry:
                state.may_have_applied = False
                state.approval_required = state.approval_required or key_gated
                if approvals.gate(run, step_id) is not None:
                    state.approval_id = None  # a new approval, before it runs again
                self.executor.set_step(
                    run, step_id, StepStatus.PENDING, f"reconciled as not applied, retried: {body.reason}"
                )
            else:
                state.side_effects, state.may_have_applied = "none", False
                self.executor.set_step(run, step_id, StepStatus.FAILED, f"reconciled as not applied: {body.reason}")
        return run

    def supply(self, tenant: str, run_id: str, step_id: str, body: InputSupply, key_id: str) -> StoredRun:
        """The value an input step waits for, from API key `key_id`: checked against its schema
        (InvalidInputValue, nothing changes), then the step's outputs; the same value again is a no-op.
        The check runs before the run's lock is taken (a costly schema holds no one else up), and
        what it relied on is checked again under the lock."""
        wait = inputs.asked(self.get(tenant, run_id), step_id, key_id, body.value)
        if wait is not None:
            inputs.check(wait, step_id, body.value)
        with self._change(tenant, run_id) as run:
            wait = inputs.asked(run, step_id, key_id, body.value)
            if wait is None:
                return run  # the same value again (a retried request)
            state = run.steps[step_id]
            wait.supplied_by = f"{body.supplied_by or 'unnamed'} (key {key_id})"
            wait.supplied_at, state.due_at = time.time(), None
            state.outputs, state.side_effects = body.value, "none"
            self.executor.set_step(run, step_id, StepStatus.SUCCEEDED, f"input supplied by {wait.supplied_by}")
        return run

    def decide(
        self, tenant: str, approval_id: str, body: Decision, key_id: str, key_gated: bool = False
    ) -> ApprovalPublic:
        """Record a decision made with API key `key_id` (the approval may name the keys allowed; a key
        whose writes need approval, `key_gated`, decides none). An approval whose subject ended
        (withdrawn, expired) answers 409 saying so."""
        approval = self.approval(tenant, approval_id)
        refused = approvals.refusal(approval.by, key_id, key_gated)
        if refused is not None:
            raise ApprovalForbidden(approval_id, why=None if approval.by and not key_gated else refused)
        wanted = ApprovalStatus.APPROVED if body.decision == "approve" else ApprovalStatus.REJECTED
        if approval.status is not wanted:
            approvals.still_open(approval)
        if approval.execution_id is not None:
            return self._decide_execution(tenant, approval, wanted, body, key_id)
        assert approval.run_id is not None
        with self._change(tenant, approval.run_id):
            approval = self.approval(tenant, approval_id)
            if approval.status is wanted:
                return approval  # the same decision again: nothing changes
            approvals.still_open(approval)
            self._record(approval, wanted, body, key_id)
        return approval

    def _record(self, approval: ApprovalPublic, wanted: ApprovalStatus, body: Decision, key_id: str) -> None:
        approval.status, approval.decided_at = wanted, time.time()
        approval.decided_by = f"{body.decided_by or 'unnamed'} (key {key_id})"
        approval.reason = body.reason or None
        self.executor.store.put_approval(approval)
        if self.executor.metrics is not None:
            self.executor.metrics.approval_wait.observe(max(approval.decided_at - approval.requested_at, 0.0))

    def _decide_execution(
        self, tenant: str, approval: ApprovalPublic, wanted: ApprovalStatus, body: Decision, key_id: str
    ) -> ApprovalPublic:
        """The execution moves first (one compare-and-set: of two decisions at once, one wins), then
        the approval records it. A decision repeated after a crash between the two finds the
        execution moved by that same decision and records it."""
        assert approval.execution_id is not None
        submissions = self.executor.submissions
        approved = wanted is ApprovalStatus.APPROVED
        why = body.reason or f"rejected by {body.decided_by or 'unnamed'} (key {key_id}) before it ran"
        if submissions.decided(tenant, approval.execution_id, approved, why) is not None:
            self._record(approval, wanted, body, key_id)
            return approval
        if approval.status is wanted:
            return approval  # the same decision again: nothing changes
        record = submissions.store.get(approval.execution_id)
        if approval.status is ApprovalStatus.PENDING and record is not None and _left_by(record) is wanted:
            self._record(approval, wanted, body, key_id)
            return approval
        raise RunConflict(f"approval {approval.id} is decided or expired: its execution is "
                          f"{record.status.value if record else 'gone'}")  # fmt: skip

    def approval(self, tenant: str, approval_id: str) -> ApprovalPublic:
        """The approval as it stands now: pending only while its subject still waits for it."""
        approval = self.executor.store.approval(approval_id)
        if approval is None or approval.tenant != tenant:
            raise ApprovalNotFound(approval_id)
        store = self.executor.store
        return approvals.as_now(store, approval, self.executor.submissions.store.get, store.get)

    def approvals(self, tenant: str) -> list[ApprovalPublic]:
        """The tenant's latest approvals, each as it stands now."""
        store, read = self.executor.store, self.executor.submissions.store.get
        run = functools.cache(store.get)  # many approvals of one run: it is read once
        return [approvals.as_now(store, a, read, run) for a in store.approvals(tenant)]

    def report_usage(self, tenant: str, run_id: str, report: ModelCallReport) -> StoredRun:
        """Record one model call of the agent's; a run whose reported tokens or cost pass its budget
        stops (failed, `budget_exceeded:tokens` or `:cost`). A call_id seen before changes nothing."""
        with self._change(tenant, run_id) as run:
            problem = usage.role_problem(run.usage, report.role)
            if problem:
                raise InvalidRequest(f"role: {problem}", (FieldProblem("role", problem),))
            if not usage.record(run.usage, run.model_calls, run.recent_call_ids, report, time.time()):
                return run
            if not run.usage.unlisted_calls:  # the listed calls' events; the rest only count
                self.executor.record(run, "usage.reported", None, report.role, usage.describe(report))
            over = usage.over_budget(run.usage, run.budgets.max_tokens, run.budgets.max_cost_usd)
            if over and not run.status.terminal:
                limit = run.budgets.max_tokens if over == "tokens" else run.budgets.max_cost_usd
                reported = run.usage.tokens if over == "tokens" else round(run.usage.cost_usd, 6)
                self.executor.stop(run, RunStatus.FAILED, f"budget_exceeded:{over}",
                                   f"the reported {over} ({reported}) passed the budget ({limit})")  # fmt: skip
        return run

    def handoff(self, tenant: str, run_id: str) -> Handoff:
        run = self.get(tenant, run_id)
        if run.status not in (RunStatus.NEEDS_REPLAN, RunStatus.GOAL_FAILED):
            raise RunConflict(
                f"run {run_id} is {run.status.value}: a hand-off exists only for a run that needs a re-plan"
            )
        return handoff.build(run, self.executor.submissions.store.get)

    # -- helpers -------------------------------------------------------------------------------

    def _allowed(self, tenant: str) -> Collection[str]:
        return self.allowed_policies(tenant)

    @contextmanager
    def _change(self, tenant: str, run_id: str) -> Iterator[StoredRun]:
        """The run under its lock; reconciled and saved after the block (unless it raised)."""
        self.get(tenant, run_id)  # 404 before taking any lock
        with self.executor.store.locked(run_id):
            run = self.executor.store.get(run_id)
            if run is None:
                raise RunNotFound(run_id)
            yield run
            readable(StoredRun, run)  # a change its reader would refuse is refused before anything is dispatched
            if run.queue != self.executor.queue:  # another deployment's run: its executor advances it now
                done = run.status.terminal and not compensation.running(run)
                self.executor.store.put(run, None if done else time.time())
                return
            if not run.status.terminal or compensation.running(run):
                self.executor.step(run)
            self.executor.save(run)

    def _apply(
        self, tenant: str, run: StoredRun, body: RevisionCreate, replanning: bool, key_id: str | None, key_gated: bool
    ) -> None:
        self._check_gates(run, body, key_id)
        known = {s.id for s in run.plan.steps}
        found = [FieldProblem(f"add.{i}.id", f"step id {s.id!r} was used before; a new step needs a new id")
                 for i, s in enumerate(body.add) if s.id in known]  # fmt: skip
        for index, step_id in enumerate(body.remove):
            status = run.steps[step_id].status if step_id in run.steps else None
            if status is None:
                found.append(FieldProblem(f"remove.{index}", f"no step {step_id!r}"))
            elif status in (StepStatus.SUCCEEDED, StepStatus.RUNNING):
                found.append(FieldProblem(f"remove.{index}", f"step {step_id!r} is {status.value}; it stays"))
        merged = run.plan.model_copy(update={"steps": [*run.plan.steps, *body.add], "goal": body.goal or run.plan.goal})
        frozen = {i: s.status.value for i, s in run.steps.items()}
        found += problems(merged, self.languages, self.policies, self._allowed(tenant), prefix="revision",
                          frozen=frozen, new_ids={s.id for s in body.add}, dispatched=run.usage.steps_dispatched,
                          scripts=lambda ref: self._script(tenant, ref),
                          used_keys=run.keys)  # fmt: skip
        if found:
            raise InvalidPlan(tuple(found))
        run.revision += 1
        run.plan = merged
        if replanning:
            run.usage.replans += 1
            if self.executor.metrics is not None:
                self.executor.metrics.replans.inc()
        # Failed, invalidated and cancelled steps never run again: a revision supersedes them,
        # with the steps removed; unknown outcomes stay until reconciled (or removed).
        settled_badly = (StepStatus.FAILED, StepStatus.UPSTREAM_FAILED, StepStatus.CANCELLED)
        for step_id, state in run.steps.items():
            if step_id in body.remove and state.status is StepStatus.AWAITING_APPROVAL and state.approval_id:
                self._withdraw(run, state.approval_id, body.reason, key_id)
            if step_id in body.remove or state.status in settled_badly:
                self.executor.set_step(run, step_id, StepStatus.SUPERSEDED, f"revision {run.revision}: {body.reason}")
        for step in body.add:
            run.steps[step.id] = StepState(revision=run.revision, approval_required=key_gated)
        self.executor.record(run, "revision.applied", None, str(run.revision),
                             f"added {len(body.add)}, removed {len(body.remove)}: {body.reason}")  # fmt: skip
        self.executor.set_run_status(run, RunStatus.RUNNING, None, f"revision {run.revision} applied")

    def _check_gates(self, run: StoredRun, body: RevisionCreate, key_id: str | None) -> None:
        """A step gated by an approval (or an input step) that names who may decide it (or supply
        it) can be removed only by one of them: otherwise a key refused the decision could remove
        the step and add its code again without the gate, or replace the value it may not give."""
        for step_id in body.remove:
            state = run.steps.get(step_id)
            if state is None or state.status.settled:
                continue
            spec, where = run.spec(step_id), f"remove.{body.remove.index(step_id)}"
            if spec.input is not None and spec.input.by and key_id not in spec.input.by:
                raise InputForbidden(step_id, where)
            gate = spec.approval
            if gate is None or not gate.required or not gate.by or key_id in gate.by:
                continue
            raise ApprovalForbidden(state.approval_id or step_id, where)

    def _withdraw(self, run: StoredRun, approval_id: str, reason: str, key_id: str | None) -> None:
        """The removed step's pending approval is closed as rejected, the revision recorded as why."""
        approval = self.executor.store.approval(approval_id)
        if approval is None or approval.status is not ApprovalStatus.PENDING:
            return
        approval.status, approval.decided_at = ApprovalStatus.REJECTED, time.time()
        approval.decided_by = f"revision {run.revision} (key {key_id or 'none'})"
        approval.reason = f"the step was removed by revision {run.revision}: {reason}"[:4000]
        self.executor.store.put_approval(approval)


def _left_by(record: ExecutionRecord) -> ApprovalStatus | None:
    """The decision that moved an execution out of awaiting_approval, read from its transitions."""
    after = record.transitions[1].status.value if len(record.transitions) > 1 else None
    rejected = record.error is not None and record.error.category.value == "approval.rejected"
    return {"queued": ApprovalStatus.APPROVED, "expired": ApprovalStatus.EXPIRED}.get(
        after or "", ApprovalStatus.REJECTED if rejected else None
    )


__all__ = ["Runs"]
