"""execbox: talk back to the service from inside a sandbox (standard library only).

    import execbox
    execbox.inputs                 # the request's JSON `inputs` (None when it had none)
    execbox.output_dir             # files written here come back as artifacts
    execbox.emit("top", value)     # a JSON value, returned under `outputs`
    execbox.check(cond, "message", **details)   # stop with check.failed when cond is false
    execbox.idempotency_key()      # the key to forward to the service written to, the same on every attempt
                                   # (a plan step's, the execution's declared key, or its Idempotency-Key)
    execbox.outcome_unknown("the provider timed out after the request left")
                                   # stop: it is unknown whether the effect happened (or raise OutcomeUnknown)
    execbox.context                # {"run_id", "step_id", "attempt", "idempotency_key"}, the ones that apply
    execbox.display(value)         # show a value as a rich result (text/plain, text/html, image/png, ...)

Values travel in a result file that the service reads after the run, never through stdout.
"""

import json
import os

output_dir = os.environ.get("EXECBOX_OUTPUT_DIR", "/workspace/out")
_RESULT = os.environ.get("EXECBOX_RESULT_FILE", os.path.join(output_dir, ".execbox", "result.json"))
_INPUTS = os.environ.get("EXECBOX_INPUTS_FILE", "/workspace/.execbox/inputs.json")
_outputs: dict[str, object] = {}
_state: dict[str, object] = {"outputs": _outputs, "check": None}


def _load_inputs() -> object:
    try:
        with open(_INPUTS, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _context() -> dict[str, str]:
    return {
        name: os.environ[f"EXECBOX_{name.upper()}"]
        for name in ("run_id", "step_id", "attempt", "idempotency_key")
        if f"EXECBOX_{name.upper()}" in os.environ
    }


inputs = _load_inputs()
context = _context()


def _reset() -> None:
    """A session's kernel calls this before each cell: outputs, a failed check and inputs belong
    to one call, never to the next."""
    global inputs
    _outputs.clear()
    _state["check"] = None
    inputs = _load_inputs()
    context.clear()
    context.update(_context())


def idempotency_key() -> str | None:
    """The key this call forwards to the service it writes to, the same on every attempt: a plan
    step's, the execution's declared one, or the request's Idempotency-Key; None when it has none."""
    return context.get("idempotency_key")


def _save() -> None:
    os.makedirs(os.path.dirname(_RESULT), exist_ok=True)
    partial = _RESULT + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(_state, f, default=repr)
    os.replace(partial, _RESULT)


def emit(name: str, value: object) -> None:
    """Declare an output value (any JSON value); the last value emitted under a name wins."""
    if not isinstance(name, str) or not name:
        raise ValueError("emit() needs a non-empty string name")
    json.dumps(value)  # refuse what is not JSON now, where the caller can see it
    _outputs[name] = value
    _save()


class CheckFailed(SystemExit):
    """Raised by check(); ends the program with exit code 1 and the execution with check.failed."""


def check(condition: object, message: object, **details: object) -> None:
    """Stop the program, reporting check.failed with message and details, unless condition holds."""
    if condition:
        return
    _state["check"] = {"message": str(message), "details": details}
    _save()
    raise CheckFailed(1)


class OutcomeUnknown(SystemExit):
    """Raise it (or call outcome_unknown) when the code cannot tell whether its effect happened, e.g.
    a provider's timeout after the request left: the execution ends with outcome.unknown, and a
    declared write's status check runs (or it waits for reconcile) instead of a blind retry."""

    def __init__(self, reason: object = "the outcome of the effect is unknown") -> None:
        _state["check"] = {"message": str(reason), "details": {}, "outcome_unknown": True}
        _save()
        super().__init__(1)


def outcome_unknown(reason: object) -> None:
    """Stop the program: whether its effect happened is unknown (see OutcomeUnknown)."""
    raise OutcomeUnknown(reason)


def display(value: object) -> None:
    """Show a value as a rich result, with every representation it offers (_repr_html_, ...)."""
    import execbox_rich

    execbox_rich.display(value)
