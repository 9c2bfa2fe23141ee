"""The executor: advancing a run from its own state, one idempotent step at a time.

`advance(run_id)` is a reconciler, called whenever something may have changed (the run was
created or revised, one of its executions ended, an approval was decided, a retry or an expiry
fell due). Under the run's lock it settles finished attempts, propagates failures downstream,
requests approvals, dispatches the steps that are ready (each attempt through
`executions.submit` under an Idempotency-Key of its own, so even a crash between dispatch and
save dispatches it once) and derives the run's status. It never calls a model and never guesses:
what it cannot decide stops the run for a re-plan or a reconcile.

Longer than 400 lines because the reconciler's rules (settling attempts and checks, propagating
failures, dispatching, deriving the run's status) are one state machine best read in one place;
what stands alone lives beside it (dispatch, approvals, refs, validation, handoff).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from execbox.catalog.schemas import NetworkAllowlist, PolicyRequest
from execbox.core.errors import CapacityError, InfrastructureError, ServiceError
from execbox.core.schemacheck import is_valid, schema_errors
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import Submissions
from execbox.files.blobs import ArtifactStore
from execbox.library.schemas import ScriptVersion
from execbox.library.service import Library
from execbox.plans import approvals, compensation, fallback, inputs, step_keys
from execbox.plans.dispatch import Dispatcher, MissingArtifact, StepRefused, script_request
from execbox.plans.metrics import PlanMetrics
from execbox.plans.refs import RefError, resolve
from execbox.plans.schemas import (
    ApprovalStatus,
    Check,
    CodeCell,
    Postconditions,
    RunEvent,
    RunStatus,
    ScriptRef,
    StepError,
    StepState,
    StepStatus,
    StoredRun,
)
from execbox.plans.store import RunStore
from execbox.plans.validation import dependencies, order

log = logging.getLogger(__name__)
UNSURE = "outcome.unknown"
"""The code's own word that it cannot tell whether its effect happened (execbox.outcome_unknown)."""
FAILED_UPSTREAM = (StepStatus.FAILED, StepStatus.UPSTREAM_FAILED, StepStatus.CANCELLED)
BUSY_RETRY_S = 1.0


@dataclass
class Executor:
    store: RunStore
    submissions: Submissions
    artifacts: ArtifactStore
    metrics: PlanMetrics | None = None
    scripts: Library | None = None
    """The script library `script:` steps run from."""

    def __post_init__(self) -> None:
        self.dispatcher = Dispatcher(self.submissions, self.artifacts)

    @property
    def queue(self) -> str:
        return self.submissions.settings.queue.name

    def advance(self, run_id: str) -> StoredRun | None:
        """Reconcile the run. A run of another queue's deployment is left to that deployment without
        taking its lock (a run's queue never changes, so a read without the lock tells): every
        deployment on a Redis sees every due run, and their locking it would starve its owner."""
        peeked = self.store.get(run_id)
        if peeked is None or peeked.queue != self.queue:
            return peeked
        with self.store.locked(run_id):
            run = self.store.get(run_id)
            if run is None or (run.status.terminal and not compensation.running(run)) or run.queue != self.queue:
                return run
            self.step(run)
            self.save(run)
            return run

    def abandon(self, run_id: str, detail: str) -> StoredRun | None:
        """End a run whose reconciliation raised what nobody foresaw: failed (`internal_error`), so it
        neither stays `running` for ever nor fails every later round of the consumer."""
        try:
            peeked = self.store.get(run_id)
            if peeked is None or peeked.queue != self.queue:
                return peeked  # another deployment's run: never ended from here
            with self.store.locked(run_id):
                run = self.store.get(run_id)
                if run is None or run.status.terminal:
                    return run
                self.stop(run, RunStatus.FAILED, "internal_error", detail)
                self.save(run)
                return run
        except Exception:
            log.exception("run %s could not be ended as failed", run_id)
            return None

    def save(self, run: StoredRun) -> None:
        self.store.put(run, self._next_due(run))

    def step(self, run: StoredRun) -> None:
        """One reconciliation of `run` (the caller holds its lock and saves it)."""
        if compensation.running(run):  # the run has stopped: only its writes are undone now
            compensation.progress(self, run)
            return
        now = time.time()
        for step_id, state in run.steps.items():
            if state.status is StepStatus.RUNNING:
                execution = self.submissions.store.get(current(state))
                if execution is None:
                    self._fail(run, step_id, "sandbox.error", "the step's execution record expired (past retention)")
                elif execution.status.terminal and state.phase:
                    self._settle_check(run, step_id, state, execution, now)
                elif execution.status.terminal:
                    self._settle(run, step_id, state, execution, now)
            elif state.status is StepStatus.AWAITING_APPROVAL and state.approval_id:
                self._check_approval(run, step_id, state, now)
            elif state.status is StepStatus.AWAITING_INPUT and state.input and now >= state.input.expires_at:
                state.side_effects = "none"
                self._fail(run, step_id, "input.expired", "nobody supplied the value before it expired")
        if now - run.created_at > run.budgets.max_wall_s:
            self.stop(
                run, RunStatus.FAILED, "budget_exceeded:wall", f"the run passed max_wall_s {run.budgets.max_wall_s:g}"
            )
            return
        self._propagate(run)
        if self._dispatch(run, now):
            self._derive(run)

    def stop(self, run: StoredRun, status: RunStatus, reason: str, detail: str) -> None:
        """End the run now: running steps' executions are cancelled, unfinished steps cancelled."""
        for step_id, state in run.steps.items():
            if state.status is StepStatus.RUNNING:
                try:
                    self.submissions.cancel(run.tenant, current(state))
                except ServiceError:
                    pass  # it ended meanwhile
                except Exception:  # its record no longer reads: the run ends all the same
                    log.warning("run %s: step %s's execution could not be cancelled", run.id, step_id, exc_info=True)
            if state.status is StepStatus.AWAITING_APPROVAL and state.approval_id:  # it ends with its subject
                approval = self.store.approval(state.approval_id)
                if approval is not None and approval.status is ApprovalStatus.PENDING:
                    approvals.close(self.store, approval, ApprovalStatus.WITHDRAWN, f"its run stopped: {detail}",
                                    time.time())  # fmt: skip
            if not state.status.settled and state.status is not StepStatus.UNKNOWN_OUTCOME:
                self._fail(run, step_id, "cancelled", detail, StepStatus.CANCELLED)
        self.set_run_status(run, status, reason, detail)

    # -- settling an attempt -------------------------------------------------------------------

    def _settle(self, run: StoredRun, step_id: str, state: StepState, execution: ExecutionRecord, now: float) -> None:
        spec = run.spec(step_id)
        if execution.status is ExecutionStatus.SUCCEEDED:
            state.outputs, state.error = execution.outputs, None
            self.set_step(run, step_id, StepStatus.SUCCEEDED, f"execution {execution.id} succeeded")
            return
        error = execution.error
        category = error.category.value if error else execution.status.value
        failure = StepError(
            category=category,
            message=error.message if error else execution.status.value,
            retryable=bool(error and error.retryable),
            details=dict(error.details) if error else {},
        )
        if execution.status is ExecutionStatus.CANCELLED:
            self.set_step(run, step_id, StepStatus.CANCELLED, "its execution was cancelled", failure)
            return
        retry_on = {c.value for c in spec.retry.on} if spec.retry else {"sandbox.error"}
        # The code said it cannot tell (outcome.unknown): run again when that is safe, never blindly.
        transient = category in (*retry_on, UNSURE) or (category == "expired" and "sandbox.error" in retry_on)
        max_attempts = spec.retry.max_attempts if spec.retry else 3
        strategy = spec.idempotency.strategy if spec.idempotency else "none"
        started = execution.started_at is not None
        writes = spec.effect == "write" or (
            spec.effect is None and isinstance(execution.policy.network, NetworkAllowlist)
        )  # an undeclared step that can reach the world may have written: never retried blindly
        state.may_have_applied = state.may_have_applied or (writes and started)  # by any attempt, not only this one
        safe = not writes or strategy == "key" or not started  # never started: nothing happened
        unknown = writes and not safe and started and category in ("sandbox.error", "limit.timeout", UNSURE)
        if transient and safe and fallback.tries(state) < max_attempts:
            self._retry(run, step_id, state, failure, now)
        elif unknown and strategy == "status_read" and spec.idempotency and spec.idempotency.status_check:
            state.error = failure  # whether to retry is the status check's to say
            self._start_check(run, step_id, state, spec.idempotency.status_check, "status_read")
        elif unknown:
            state.side_effects = "unknown"
            why = f"{category} after its code started; its effect may or may not have happened"
            self.set_step(run, step_id, StepStatus.UNKNOWN_OUTCOME, why, failure)
        else:
            state.side_effects = "possible" if state.may_have_applied else "none"
            self._give_up(run, step_id, state, failure)

    def _give_up(self, run: StoredRun, step_id: str, state: StepState, failure: StepError) -> None:
        """The step failed for good, unless its fallback answers the failure: then that runs instead."""
        spec = run.spec(step_id)
        if fallback.answers(spec, state, failure.category, state.side_effects):
            assert spec.fallback is not None
            fallback.begin(state, failure)
            why = f"{failure.category}: {failure.message}; its fallback {spec.fallback.name} runs instead"
            self.record(run, "step.fallback", step_id, None, why)
            self.set_step(run, step_id, StepStatus.PENDING, why)
            return
        self.set_step(run, step_id, StepStatus.FAILED, f"{failure.category}: {failure.message}", failure)

    def _retry(self, run: StoredRun, step_id: str, state: StepState, failure: StepError, now: float) -> None:
        spec = run.spec(step_id)
        interval = spec.retry.interval_s if spec.retry else 1.0
        state.due_at, state.error, state.passed = now + interval * 2 ** (fallback.tries(state) - 1), failure, 0
        why = f"{failure.category}: retrying (attempt {len(state.attempts) + 1})"
        self.set_step(run, step_id, StepStatus.PENDING, why)

    def _settle_check(
        self, run: StoredRun, step_id: str, state: StepState, execution: ExecutionRecord, now: float
    ) -> None:
        """A precondition or status check ended: it holds (its outputs satisfy `expect`), it does
        not, or it could not tell (its execution failed)."""
        spec = run.spec(step_id)
        phase, state.phase = state.phase or "", None
        check = spec.idempotency.status_check if phase == "status_read" and spec.idempotency else None
        check = check or spec.preconditions[int(phase.split(":")[1])]
        holds: bool | None = None
        if execution.status is ExecutionStatus.SUCCEEDED:
            holds = is_valid(check.expect, execution.outputs)
        if phase == "status_read":
            max_attempts = spec.retry.max_attempts if spec.retry else 3
            if holds is False:
                state.may_have_applied = False  # the status check says the effect did not happen
            if holds:
                state.outputs, state.side_effects = execution.outputs, "none"
                self.set_step(run, step_id, StepStatus.SUCCEEDED, f"{check.name}: the effect happened (applied)")
            elif holds is False and fallback.tries(state) < max_attempts:
                self._retry(run, step_id, state, state.error or StepError(category="sandbox.error", message=""), now)
            elif holds is False:
                state.side_effects = "none"
                self._fail(run, step_id, "attempts.exhausted", f"{check.name}: not applied, and no attempt left")
            else:
                state.side_effects = "unknown"
                why = f"{check.name} could not tell whether the effect happened ({execution.status.value})"
                self.set_step(run, step_id, StepStatus.UNKNOWN_OUTCOME, why)
        elif holds:
            state.passed += 1
            self.set_step(run, step_id, StepStatus.PENDING, f"precondition {check.name} holds")
        else:
            state.side_effects = "possible" if state.may_have_applied else "none"  # an earlier attempt's code ran
            outcome = "does not hold" if holds is False else f"could not be checked ({execution.status.value})"
            message = f"precondition {check.name} {outcome}"
            self._give_up(run, step_id, state, StepError(category="precondition.failed", message=message))

    def _check_approval(self, run: StoredRun, step_id: str, state: StepState, now: float) -> None:
        assert state.approval_id is not None
        approval = approvals.current(self.store, state.approval_id, now)
        if approval is None:
            return
        if approval.status is ApprovalStatus.APPROVED:
            state.due_at = None
            self.set_step(run, step_id, StepStatus.PENDING, f"approved by {approval.decided_by or 'someone'}")
        elif approval.status in (ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED):
            category = f"approval.{approval.status.value}"
            message = approval.reason or f"the approval was {approval.status.value}"
            self._fail(run, step_id, category, message)
            state.side_effects = "none"

    # -- propagation and dispatch ----------------------------------------------------------------

    def _live(self, run: StoredRun) -> list[str]:
        specs = [s for s in run.plan.steps if run.steps[s.id].status is not StepStatus.SUPERSEDED]
        return order(specs)

    def _propagate(self, run: StoredRun) -> None:
        for step_id in self._live(run):
            state = run.steps[step_id]
            if state.status is not StepStatus.PENDING:
                continue
            deps = dependencies(run.spec(step_id))
            failed = sorted(d for d in deps if run.steps[d].status in FAILED_UPSTREAM)
            if failed:
                state.blocked_by = failed
                why = f"upstream {', '.join(failed)} did not succeed"
                self._fail(run, step_id, "dependency.failed", why, StepStatus.UPSTREAM_FAILED)
            else:
                state.blocked_by = sorted(d for d in deps if run.steps[d].status is StepStatus.UNKNOWN_OUTCOME
                                          or run.steps[d].blocked_by)  # fmt: skip

    def _dispatch(self, run: StoredRun, now: float) -> bool:
        """Start every ready step the budgets allow; False when a budget stopped the run."""
        running = sum(1 for s in run.steps.values() if s.status is StepStatus.RUNNING)
        for step_id in self._live(run):
            state = run.steps[step_id]
            spec = run.spec(step_id)
            ready = state.status is StepStatus.PENDING and not state.blocked_by
            if not ready or any(run.steps[d].status is not StepStatus.SUCCEEDED for d in dependencies(spec)):
                continue
            if state.due_at is not None and state.due_at > now:
                continue
            raw_args = spec.args if spec.input is not None else fallback.what_runs(spec, state)[1]
            try:
                state.args = resolve(raw_args, self.state_document(run))
            except RefError as exc:
                self._fail(run, step_id, "input.invalid", exc.message)
                continue
            if spec.input is not None:
                self._ask(run, step_id, state, now)
                continue
            if state.approval_id is None and approvals.gate(run, step_id) is not None:
                self._request_approval(run, step_id, state, now)
                continue
            if running >= run.budgets.max_parallel:
                continue
            if run.usage.steps_dispatched >= run.budgets.max_steps:
                self.stop(run, RunStatus.FAILED, "budget_exceeded:steps",
                          f"dispatching {step_id} would pass max_steps {run.budgets.max_steps}")  # fmt: skip
                return False
            if self._start(run, step_id, state, now):
                running += 1
        return True

    def _start(self, run: StoredRun, step_id: str, state: StepState, now: float) -> bool:
        """Dispatch the step's next precondition, or (all of them held) the attempt itself."""
        spec = run.spec(step_id)
        attempt = len(state.attempts) + 1
        if not self._keyed(run, step_id, state):
            return False
        if fallback.active(spec, state) is None and state.passed < len(spec.preconditions):
            return self._start_check(
                run, step_id, state, spec.preconditions[state.passed], f"precondition:{state.passed}"
            )
        what, raw_args, policy = fallback.what_runs(spec, state)
        cell: CodeCell | ExecutionCreate | None = what if isinstance(what, CodeCell) else None
        if cell is None:
            assert isinstance(what, ScriptRef)
            cell = self._script_request(run, step_id, state, what, policy)
            if cell is None:
                return False
        launched = self._launch(run, step_id, state, now, cell, raw_args, state.args or {}, attempt,
                                spec.postconditions, policy=policy)  # fmt: skip
        if launched is None:
            return False
        state.attempts.append(launched)
        state.phase = None
        which = f" ({spec.fallback.name})" if spec.fallback is not None and fallback.active(spec, state) else ""
        self.set_step(run, step_id, StepStatus.RUNNING, f"attempt {attempt}{which}: execution {launched}")
        return True

    def _keyed(self, run: StoredRun, step_id: str, state: StepState) -> bool:
        """Render the step's key template (once), or fail the step when it cannot be used: a path
        the arguments lack, or a key another write of the run used with other arguments."""
        spec = run.spec(step_id)
        template = spec.idempotency.key if spec.idempotency is not None else None
        if template is None or state.key is not None:
            return True
        try:
            key = step_keys.render(template, state.args or {})
        except step_keys.KeyProblem as exc:
            self._fail(run, step_id, "input.invalid", str(exc))
            return False
        made_from = step_keys.digest(state.args or {})
        if run.keys.setdefault(key, made_from) != made_from:
            self._fail(run, step_id, "input.invalid", f"key {key!r} is already another write's, with other arguments")
            return False
        state.key = key
        return True

    def _script_request(
        self, run: StoredRun, step_id: str, state: StepState, ref: ScriptRef, policy: PolicyRequest
    ) -> ExecutionCreate | None:
        assert self.scripts is not None
        try:
            body, state.script = script_request(self.scripts, run, step_id, ref, state.args or {}, policy)
        except StepRefused as exc:
            self._fail(run, step_id, exc.category, exc.message)
            return None
        return body

    def _start_check(self, run: StoredRun, step_id: str, state: StepState, check: Check, phase: str) -> bool:
        spec = run.spec(step_id)
        try:
            args = resolve(check.args, self.state_document(run))
        except RefError as exc:
            self._fail(run, step_id, "input.invalid", f"{check.name}: {exc.message}")
            return False
        attempt, suffix = len(state.attempts) + 1, f":{phase}:{len(state.checks)}"
        launched = self._launch(run, step_id, state, time.time(), check.run, check.args, args, attempt, None, suffix,
                                spec.policy)  # fmt: skip
        if launched is None:
            return False
        state.checks.append(launched)
        state.phase = phase
        self.set_step(run, step_id, StepStatus.RUNNING, f"{phase} ({check.name}): execution {launched}")
        return True

    def _launch(
        self, run: StoredRun, step_id: str, state: StepState, now: float, cell: CodeCell | ExecutionCreate,
        raw_args: dict[str, Any],
        args: dict[str, Any], attempt: int, post: Postconditions | None, suffix: str = "",
        policy: PolicyRequest | None = None,
    ) -> str | None:  # fmt: skip
        spec = run.spec(step_id)
        try:
            execution_id = self.dispatcher.submit(
                run, step_id, cell, raw_args, args, attempt, policy or spec.policy, spec.files, post, suffix, state.key
            )
        except MissingArtifact as exc:
            self._fail(run, step_id, "input.invalid", str(exc))
            return None
        except (CapacityError, InfrastructureError) as exc:
            state.due_at = now + BUSY_RETRY_S  # quotas or Redis: the same attempt, a moment later
            self.record(run, "step.deferred", step_id, None, exc.message)
            return None
        except ServiceError as exc:
            self._fail(run, step_id, exc.code, exc.message)
            return None
        state.due_at = None
        run.usage.steps_dispatched += 1
        return execution_id

    def _ask(self, run: StoredRun, step_id: str, state: StepState, now: float) -> None:
        """An input step is ready: it waits for its value, its resolved `args` shown as the context."""
        state.input = inputs.ask(run.spec(step_id), now)
        state.due_at = state.input.expires_at
        run.notify("input.requested", step=step_id)
        self.set_step(run, step_id, StepStatus.AWAITING_INPUT, state.input.summary or "waiting for its value")

    def _request_approval(self, run: StoredRun, step_id: str, state: StepState, now: float) -> None:
        spec = run.spec(step_id)
        required_by = approvals.REQUIRED_BY if spec.approval is None or not spec.approval.required else None
        files = approvals.step_files(run, step_id, state, self.submissions.files, self.artifacts)
        what = fallback.what_runs(spec, state)[0]
        script = self._script(run.tenant, what.script) if isinstance(what, ScriptRef) else None
        shown = approvals.step_shown(run, step_id, state, files, required_by, script)
        code = script.code if script is not None else None
        approval = approvals.request(self.store, run, step_id, state, now, shown, code)
        state.approval_id, state.due_at = approval.id, approval.expires_at
        run.notify("approval.requested", approval=approval.id)
        self.set_step(run, step_id, StepStatus.AWAITING_APPROVAL, f"approval {approval.id} requested")

    def _script(self, tenant: str, ref: str) -> ScriptVersion | None:
        """The script `name@version` names now (what its approval shows), or None."""
        if self.scripts is None:
            return None
        name, _, version = ref.partition("@")
        try:
            return self.scripts.resolve(tenant, name, version)
        except ServiceError:
            return None  # the step fails when it is dispatched, saying why

    # -- the run's status --------------------------------------------------------------------

    def _derive(self, run: StoredRun) -> None:
        live = [run.steps[i] for i in self._live(run)]
        statuses = {s.status for s in live}
        if statuses <= {StepStatus.SUCCEEDED}:
            goal = run.plan.goal
            if goal is not None:
                outputs = run.steps[goal.step].outputs or {}
                errors = sorted(e.message for e in schema_errors(goal.outputs_schema, outputs))
                if errors:
                    self.set_run_status(run, RunStatus.GOAL_FAILED, "goal_failed", "; ".join(errors))
                    return
            self.set_run_status(run, RunStatus.SUCCEEDED, "completed", "every step succeeded")
            return
        startable = [
            i for i in self._live(run)
            if run.steps[i].status is StepStatus.PENDING and not run.steps[i].blocked_by
            and all(run.steps[d].status is StepStatus.SUCCEEDED for d in dependencies(run.spec(i)))
        ]  # fmt: skip
        if StepStatus.RUNNING in statuses or startable:
            self.set_run_status(run, RunStatus.RUNNING, None, "steps are running or ready")
        elif StepStatus.AWAITING_INPUT in statuses:  # before approvals: the agent waiting can act on it
            self.set_run_status(run, RunStatus.AWAITING_INPUT, None, "waiting for a step's input")
        elif StepStatus.AWAITING_APPROVAL in statuses:
            self.set_run_status(run, RunStatus.AWAITING_APPROVAL, None, "waiting for an approval")
        else:
            self.set_run_status(run, RunStatus.NEEDS_REPLAN, "step_failed", "no step can make progress")

    def set_run_status(self, run: StoredRun, status: RunStatus, reason: str | None, detail: str) -> None:
        if run.status is not status:
            run.status, run.stop_reason = status, reason
            self.record(run, "run.status_changed", None, status.value, detail)
            if status in (RunStatus.NEEDS_REPLAN, RunStatus.GOAL_FAILED):
                run.notify("run.needs_replan", status=status.value)
            if status.terminal:
                run.notify("run.finished", status=status.value)
                run.finished_at = time.time()
                if self.metrics is not None:
                    self.metrics.runs.labels(status.value, reason or "none").inc()

    def _fail(
        self, run: StoredRun, step_id: str, category: str, message: str, status: StepStatus = StepStatus.FAILED
    ) -> None:
        self.set_step(run, step_id, status, message, StepError(category=category, message=message))

    def set_step(
        self, run: StoredRun, step_id: str, status: StepStatus, detail: str, error: StepError | None = None
    ) -> None:
        state = run.steps[step_id]
        if error is not None:
            state.error = error
        if state.status is not status:
            state.status = status
            if self.metrics is not None and (status.settled or status is StepStatus.UNKNOWN_OUTCOME):
                self.metrics.steps.labels(status.value).inc()
            self.record(run, "step.status_changed", step_id, status.value, detail)

    def record(self, run: StoredRun, kind: str, step_id: str | None, status: str | None, detail: str) -> None:
        run.events.append(RunEvent(at=time.time(), type=kind, step=step_id, status=status, detail=detail[:500]))

    @staticmethod
    def state_document(run: StoredRun) -> dict[str, object]:
        """The document references point into."""
        steps = {i: {"outputs": s.outputs or {}} for i, s in run.steps.items() if s.status is StepStatus.SUCCEEDED}
        return {"inputs": run.inputs, "steps": steps}

    @staticmethod
    def _next_due(run: StoredRun) -> float | None:
        if compensation.running(run):  # its undos' ends advance it; this catches a deferred one
            return time.time() + 5 * BUSY_RETRY_S
        if run.status.terminal:
            return None
        due = [run.created_at + run.budgets.max_wall_s]
        waiting = (StepStatus.PENDING, StepStatus.AWAITING_APPROVAL, StepStatus.AWAITING_INPUT)
        due += [s.due_at for s in run.steps.values() if s.due_at is not None and s.status in waiting]
        return min(due)


def current(state: StepState) -> str:
    """The execution the step waits for: its running check, or its latest attempt."""
    return state.checks[-1] if state.phase else state.attempts[-1]
