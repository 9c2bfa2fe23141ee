"""Compensation: a run's succeeded writes undone one at a time, in reverse dependency order.

Asked for by `POST /v1/runs/{id}/cancel` with `compensate: true` or by `POST /v1/runs/{id}/compensate`
(an unfinished run is first stopped as cancelled: the agent abandons it). Each step's compensation
is an execution of its own, dispatched like a check (listed in the step's `checks`, so its end
advances the run) and declared a keyed write whose key is the step's with `:undo`: a worker lost
while it runs has it run again in place with the same key (execbox.executions.effects), so the
service it talks to sees one undo. Any other failure stops the compensation: the step shows why,
nothing before it in the dependency order is undone, and nothing is retried blindly; asking again
resumes at that step. Writes that cannot be undone (none declared, an unknown outcome, stopped
while running) are listed as skipped, with why.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import ValidationError

from execbox.core.errors import CapacityError, InfrastructureError, ServiceError
from execbox.executions.effects import EffectIdempotency
from execbox.executions.schemas import ExecutionCreate
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import Submissions
from execbox.plans.dispatch import Dispatcher, MissingArtifact
from execbox.plans.refs import RefError, resolve
from execbox.plans.schemas import CompensationRun, StepStatus, StoredRun, Undo
from execbox.plans.step_keys import default_key
from execbox.plans.validation import order


class ExecutorParts(Protocol):
    """What compensation uses of the executor (execbox.plans.executor.Executor)."""

    @property
    def submissions(self) -> Submissions: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    def record(self, run: StoredRun, kind: str, step_id: str | None, status: str | None, detail: str) -> None: ...
    def state_document(self, run: StoredRun) -> dict[str, object]: ...


def running(run: StoredRun) -> bool:
    return run.compensation is not None and run.compensation.status == "running"


def left_to_undo(run: StoredRun) -> list[str]:
    """The succeeded steps with a compensation that has not undone them yet."""
    done = {i for i, state in run.steps.items() if state.undo is not None and state.undo.status == "done"}
    succeeded = [i for i, state in run.steps.items() if state.status is StepStatus.SUCCEEDED and i not in done]
    return [i for i in succeeded if run.spec(i).compensation is not None]


def begin(run: StoredRun, reason: str, now: float) -> list[str]:
    """Start (or resume after a stop) the run's compensation; the steps it will undo, in order."""
    undoable = []
    for step_id in reversed(order(run.plan.steps)):
        state, spec = run.steps[step_id], run.spec(step_id)
        writes = spec.effect == "write" or spec.compensation is not None
        if state.undo is not None and state.undo.status == "done":
            undoable.append(step_id)
        elif state.status is StepStatus.SUCCEEDED and spec.compensation is not None:
            state.undo = Undo()
            undoable.append(step_id)
        elif state.status is StepStatus.SUCCEEDED and writes:
            state.undo = Undo(status="skipped", reason="no compensation declared: its effect stays")
        elif writes and state.status is StepStatus.UNKNOWN_OUTCOME:
            state.undo = Undo(status="skipped", reason="its outcome is unknown: reconcile it, then compensate again")
        elif writes and state.status is StepStatus.CANCELLED and state.attempts:
            state.undo = Undo(status="skipped", reason="stopped while it ran: its effect may have happened")
        elif writes and state.status is StepStatus.FAILED and state.side_effects == "possible":
            state.undo = Undo(status="skipped", reason="it failed after its code started: its effect may have happened")
    run.compensation = CompensationRun(status="running", reason=reason, requested_at=now, order=undoable)
    return undoable


def progress(executor: ExecutorParts, run: StoredRun) -> None:
    """One reconciliation of a running compensation (the caller holds the run's lock and saves it):
    settle the undo that ended, start the next, or finish."""
    compensation = run.compensation
    assert compensation is not None
    if _still_running(executor, run):  # a step stopped by the cancel has not ended yet: undo after it
        return
    for step_id in compensation.order:
        state = run.steps[step_id]
        undo = state.undo or Undo()
        if undo.status == "done":
            continue
        if undo.status == "running":
            execution = executor.submissions.store.get(undo.execution or "")
            if execution is not None and not execution.status.terminal:
                return
            if execution is not None and execution.status is ExecutionStatus.SUCCEEDED:
                undo.status = "done"
                executor.record(run, "step.compensated", step_id, "done", f"execution {execution.id} undid it")
                continue
            error = execution.error if execution is not None else None
            why = f"{error.category.value}: {error.message}" if error else "its execution's record expired"
            _stop(executor, run, step_id, undo, why)
            return
        _launch(executor, run, step_id, undo)  # its end (or the due time, when deferred) comes back here
        return
    compensation.status = "completed"
    executor.record(run, "compensation.completed", None, "completed", f"{len(compensation.order)} write(s) undone")
    run.notify("run.compensated", status="completed")


def _still_running(executor: ExecutorParts, run: StoredRun) -> bool:
    """An attempt the run's stop cancelled is still running (its end advances the run again)."""
    for state in run.steps.values():
        if state.status is StepStatus.CANCELLED and state.attempts:
            execution = executor.submissions.store.get(state.attempts[-1])
            if execution is not None and not execution.status.terminal:
                return True
    return False


def _launch(executor: ExecutorParts, run: StoredRun, step_id: str, undo: Undo) -> None:
    """Dispatch the step's compensation (or stop the compensation, or defer it to the run's due time)."""
    spec, state = run.spec(step_id), run.steps[step_id]
    assert spec.compensation is not None
    try:
        args = resolve(spec.compensation.args, executor.state_document(run))
    except RefError as exc:
        _stop(executor, run, step_id, undo, f"input.invalid: {exc.message}")
        return
    policy = spec.compensation.policy or spec.policy
    try:
        body = ExecutionCreate(
            language=spec.compensation.run.language, code=spec.compensation.run.code, inputs=args, policy=policy,
            effect="write", idempotency=EffectIdempotency(strategy="key"),
        )  # fmt: skip
    except ValidationError as exc:  # refused at validation; a run stored before that check may hold one
        _stop(executor, run, step_id, undo, f"input.invalid: {exc.errors()[0]['msg']}")
        return
    key = f"{state.key or default_key(run.id, step_id)}:undo"
    suffix = f":undo:{len(state.checks)}"
    try:
        launched = executor.dispatcher.submit(
            run, step_id, body, spec.compensation.args, args, len(state.attempts), policy, [], None, suffix, key
        )
    except (CapacityError, InfrastructureError) as exc:  # quotas or Redis: the same undo, a moment later
        executor.record(run, "compensation.deferred", step_id, None, exc.message)
        return
    except (ServiceError, MissingArtifact) as exc:
        _stop(executor, run, step_id, undo, str(exc))
        return
    undo.status, undo.execution = "running", launched
    state.undo = undo
    state.checks.append(launched)
    executor.record(run, "step.compensating", step_id, "running", f"execution {launched}")


def _stop(executor: ExecutorParts, run: StoredRun, step_id: str, undo: Undo, why: str) -> None:
    assert run.compensation is not None
    undo.status, undo.reason = "failed", why
    run.steps[step_id].undo = undo
    run.compensation.status = "stopped"
    executor.record(run, "compensation.stopped", step_id, "failed", why)
    run.notify("run.compensated", status="stopped")
