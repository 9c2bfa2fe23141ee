"""The `handoff/v1` document: what a re-planner needs, and nothing it does not.

Completed steps with their outputs and artifact references (so that a revision can refer to them
instead of repeating them), failed steps with their categorized error, the tails of their output
and whether their effect may have happened, unknown outcomes, what the failures invalidated, what
still waits, which fallbacks ran and why, and the budgets and model usage (per role) so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from execbox.executions.record import ExecutionRecord
from execbox.plans.schemas import Budgets, CodeCell, RunStatus, StepError, StepSpec, StepState, StepStatus, StoredRun
from execbox.plans.usage import Usage


class HandoffStep(BaseModel):
    step_id: str
    status: StepStatus
    code: str | None = None
    args: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    artifacts: list[str] = Field(default_factory=list, description="`$artifact` references to its artifacts.")
    attempts: int = 0
    error: StepError | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    side_effects: str | None = None
    blocked_by: list[str] = Field(default_factory=list)
    fallback_from: StepError | None = Field(None, description="When its fallback ran: the failure that made it run.")


class Handoff(BaseModel):
    """What a re-planner needs: what is done, what failed and why, what that invalidated, what remains."""

    format: Literal["handoff/v1"] = "handoff/v1"
    run_id: str
    revision: int
    objective: str
    status: RunStatus
    reason: str | None
    completed: list[HandoffStep]
    failed: list[HandoffStep]
    unknown_outcomes: list[HandoffStep]
    invalidated: list[HandoffStep]
    remaining: list[HandoffStep]
    budgets: Budgets
    usage: Usage
    constraints: list[str]
    revise: dict[str, Any]


TAIL_CHARS = 2000
CONSTRAINTS = [
    'Completed steps are frozen: refer to their outputs with {"$ref": "/steps/<id>/outputs/<name>"} and to '
    'their files with {"$artifact": "/steps/<id>/artifacts/<name>"}; do not repeat them.',
    "New steps need new ids: an id used in any revision (failed and superseded ones included) is taken.",
    "Every write step declares an idempotency strategy.",
    "Failed and invalidated steps never run again; a revision supersedes them.",
    "A step with an unknown outcome is settled by POST /v1/runs/{id}/steps/{step}/reconcile, or removed.",
    "A step may declare a fallback for foreseen failures instead of costing a re-plan: "
    '"fallback": {"on": ["check.failed"], "run": {...}, "args": {...}}; it never runs after a write that may '
    "have applied.",
]


def _code(spec: StepSpec, state: StepState) -> str | None:
    """The code the step ran last: its own, or its fallback's once that ran (none for a script or an input)."""
    what = spec.fallback.run if spec.fallback is not None and state.fallback_from is not None else spec.run
    return what.code if isinstance(what, CodeCell) else None


def build(run: StoredRun, execution: Callable[[str], ExecutionRecord | None]) -> Handoff:
    groups: dict[str, list[HandoffStep]] = {k: [] for k in ("completed", "failed", "unknown", "invalidated", "rest")}
    for spec in run.plan.steps:
        state = run.steps[spec.id]
        last = execution(state.attempts[-1]) if state.attempts else None
        item = HandoffStep(
            step_id=spec.id,
            status=state.status,
            code=_code(spec, state),
            args=state.args,
            outputs=state.outputs,
            artifacts=[f"/steps/{spec.id}/artifacts/{a.name}" for a in last.artifacts] if last else [],
            attempts=len(state.attempts),
            error=state.error,
            side_effects=state.side_effects,
            blocked_by=state.blocked_by,
            fallback_from=state.fallback_from,
        )
        if state.status in (StepStatus.FAILED, StepStatus.UNKNOWN_OUTCOME) and last is not None:
            item.stdout_tail, item.stderr_tail = last.stdout[-TAIL_CHARS:], last.stderr[-TAIL_CHARS:]
        group = {
            StepStatus.SUCCEEDED: "completed",
            StepStatus.FAILED: "failed",
            StepStatus.UNKNOWN_OUTCOME: "unknown",
            StepStatus.UPSTREAM_FAILED: "invalidated",
            StepStatus.SUPERSEDED: None,
        }.get(state.status, "rest")
        if group is not None:
            groups[group].append(item)
    return Handoff(
        run_id=run.id,
        revision=run.revision,
        objective=run.objective,
        status=run.status,
        reason=run.stop_reason,
        completed=groups["completed"],
        failed=groups["failed"],
        unknown_outcomes=groups["unknown"],
        invalidated=groups["invalidated"],
        remaining=groups["rest"],
        budgets=run.budgets,
        usage=run.usage,
        constraints=CONSTRAINTS,
        revise={"method": "POST", "url": f"/v1/runs/{run.id}/revisions", "base_revision": run.revision},
    )
