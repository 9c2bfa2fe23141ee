"""Input steps: a value supplied from outside the sandbox (an agent's model call, a person) while
the run waits. The executor asks when the step's dependencies succeeded (its resolved `args` are
the supplier's context); a supply is checked here (who may give it, whether it is still asked
for, its schema) before the run takes it as the step's outputs.
"""

from __future__ import annotations

import json
import time
from typing import Any

from execbox.library.service import input_problems
from execbox.plans.errors import InputForbidden, InvalidInputValue, RunConflict
from execbox.plans.schemas import InputWait, StepSpec, StepStatus, StoredRun


def ask(spec: StepSpec, now: float) -> InputWait:
    """The request of an input step that became ready now."""
    asked = spec.input
    assert asked is not None
    return InputWait(summary=asked.summary, value_schema=asked.value_schema, expires_at=now + asked.expires_in_s,
                     by=asked.by)  # fmt: skip


def asked(run: StoredRun, step_id: str, key_id: str, value: dict[str, Any]) -> InputWait | None:
    """The request `value` answers; None when the step already has that very value (a retried
    request); raises when the step takes no value now, or not from this key."""
    state = run.steps.get(step_id)
    wait = state.input if state is not None else None
    if state is None or wait is None:
        raise RunConflict(f"step {step_id!r} is not an input step that was asked for")
    if state.status is StepStatus.SUCCEEDED and _canonical(state.outputs) == _canonical(value):
        return None
    if state.status is not StepStatus.AWAITING_INPUT:
        raise RunConflict(f"step {step_id!r} is {state.status.value}; it takes no value now")
    if wait.by and key_id not in wait.by:
        raise InputForbidden(step_id)
    if time.time() >= wait.expires_at:
        raise RunConflict(f"step {step_id!r}'s request expired; the run goes on without it")
    return wait


def check(wait: InputWait, step_id: str, value: dict[str, Any]) -> None:
    """InvalidInputValue naming each problem when the schema refuses the value."""
    found = input_problems(wait.value_schema, value, "value")
    if found:
        raise InvalidInputValue(step_id, tuple(found))


def _canonical(value: object) -> str:
    """JSON that tells values apart as JSON does (`true`, `1` and `1.0` are three values)."""
    return json.dumps(value, sort_keys=True)
