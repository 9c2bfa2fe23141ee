"""execbox: talk back to the service from inside a sandbox (standard library only).

    import execbox
    execbox.inputs                 # the request's JSON `inputs` (None when it had none)
    execbox.output_dir             # files written here come back as artifacts
    execbox.emit("top", value)     # a JSON value, returned under `outputs`
    execbox.check(cond, "message", **details)   # stop with check.failed when cond is false
    execbox.idempotency_key()      # in a plan's write step: the key to forward, the same on every attempt
    execbox.context                # in a plan's step: {"run_id", "step_id", "attempt", "idempotency_key"}
    execbox.display(value)         # show a value as a rich result (text/plain, text/html, image/png, ...)

Values travel in a result file that the service reads after the run, never through stdout.
"""

import json
import os

output_dir = os.environ.get("EXECBOX_OUTPUT_DIR", "/workspace/out")
_RESULT = os.environ.get("EXECBOX_RESULT_FILE", os.path.join(output_dir, ".execbox", "result.json"))
_INPUTS = os.environ.get("EXECBOX_INPUTS_FILE", "/workspace/.execbox/inputs.json")
_state = {"outputs": {}, "check": None}


def _load_inputs():
    try:
        with open(_INPUTS, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


inputs = _load_inputs()
context = {
    name: os.environ[f"EXECBOX_{name.upper()}"]
    for name in ("run_id", "step_id", "attempt", "idempotency_key")
    if f"EXECBOX_{name.upper()}" in os.environ
}


def _reset():
    """A session's kernel calls this before each cell: outputs, a failed check and inputs belong
    to one call, never to the next."""
    global inputs
    _state["outputs"] = {}
    _state["check"] = None
    inputs = _load_inputs()


def idempotency_key():
    """The step's idempotency key (stable across its attempts); None outside a plan's step."""
    return context.get("idempotency_key")


def _save():
    os.makedirs(os.path.dirname(_RESULT), exist_ok=True)
    partial = _RESULT + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(_state, f, default=repr)
    os.replace(partial, _RESULT)


def emit(name, value):
    """Declare an output value (any JSON value); the last value emitted under a name wins."""
    if not isinstance(name, str) or not name:
        raise ValueError("emit() needs a non-empty string name")
    json.dumps(value)  # refuse what is not JSON now, where the caller can see it
    _state["outputs"][name] = value
    _save()


class CheckFailed(SystemExit):
    """Raised by check(); ends the program with exit code 1 and the execution with check.failed."""


def check(condition, message, **details):
    """Stop the program, reporting check.failed with message and details, unless condition holds."""
    if condition:
        return
    _state["check"] = {"message": str(message), "details": details}
    _save()
    raise CheckFailed(1)


def display(value):
    """Show a value as a rich result, with every representation it offers (_repr_html_, ...)."""
    import execbox_rich

    execbox_rich.display(value)
