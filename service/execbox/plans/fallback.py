"""Declared fallbacks: the alternative a step runs once, in place, when its own run fails with a
category it names (`fallback.on`), so a foreseen failure costs no re-plan.

The fallback is the same step: its attempts join the step's, its outputs are the step's (its
dependents and postconditions are unchanged), its retries are counted afresh, and the step's
preconditions do not apply to it, and a step gated by an approval asks for it again, showing the
fallback's code. It never runs for a step whose effect may have happened (a write whose code
started); such a failure stays the step's, for a reconcile or a re-plan.
"""

from __future__ import annotations

from typing import Any

from execbox.catalog.schemas import PolicyRequest
from execbox.plans.schemas import CodeCell, Fallback, ScriptRef, StepError, StepSpec, StepState


def active(spec: StepSpec, state: StepState) -> Fallback | None:
    """The fallback when it is what the step runs now."""
    return spec.fallback if state.fallback_from is not None else None


def answers(spec: StepSpec, state: StepState, category: str, side_effects: str | None) -> bool:
    """Whether the step's failure (category, and whether its effect may have happened) runs its fallback."""
    fallback = spec.fallback
    if fallback is None or state.fallback_from is not None or side_effects != "none":
        return False
    return category in {c.value for c in fallback.on}


def begin(state: StepState, failure: StepError) -> None:
    """The fallback runs next; a gated step asks its approval again (the code it showed is not what runs now)."""
    state.fallback_from, state.fallback_at = failure, len(state.attempts) + 1
    state.error, state.passed, state.due_at, state.approval_id = failure, 0, None, None


def tries(state: StepState) -> int:
    """Attempts of what the step runs now (its own run, or its fallback)."""
    return len(state.attempts) - (state.fallback_at or 1) + 1


def what_runs(spec: StepSpec, state: StepState) -> tuple[CodeCell | ScriptRef, dict[str, Any], PolicyRequest]:
    """The step's run, arguments (unresolved) and policy, or its fallback's."""
    fallback = active(spec, state)
    if fallback is not None:
        return fallback.run, fallback.args, fallback.policy or spec.policy
    assert spec.run is not None, "an input step runs nothing"
    return spec.run, spec.args, spec.policy
