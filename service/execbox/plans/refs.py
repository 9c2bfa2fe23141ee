"""References inside step arguments, and their resolution against the run's state.

An argument value is plain JSON, or an object with one key:

- `{"$ref": "/inputs/<name>..."}` or `{"$ref": "/steps/<id>/outputs/<name>..."}`: a JSON Pointer
  (RFC 6901) into the run state `{"inputs": ..., "steps": {"<id>": {"outputs": ...}}}`; the value
  keeps its JSON type. The dotted form `steps.<id>.outputs.<name>` is accepted too.
- `{"$artifact": "/steps/<id>/artifacts/<name>"}`: a file another step produced; it is placed in
  the step's working directory under `artifacts/<id>/<name>` and the argument is that path.

References may sit anywhere inside an argument (in lists and objects), at most MAX_DEPTH deep.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting of an argument value."""


@dataclass(frozen=True)
class Ref:
    kind: str
    """`ref` (a value) or `artifact` (a file)."""
    pointer: tuple[str, ...]
    """The pointer's tokens, e.g. ("steps", "fetch", "outputs", "rows")."""
    path: str
    """Where it sits in the step, as a JSON path (for problems)."""

    @property
    def step(self) -> str | None:
        return self.pointer[1] if len(self.pointer) >= 2 and self.pointer[0] == "steps" else None


class RefError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def parse_pointer(text: str) -> tuple[str, ...]:
    """A JSON Pointer (or the dotted form) as its tokens."""
    if text.startswith("/"):
        return tuple(token.replace("~1", "/").replace("~0", "~") for token in text[1:].split("/"))
    if text.startswith(("steps.", "inputs")):
        return tuple(text.split("."))
    raise RefError("", f"{text!r} is not a JSON Pointer (`/steps/<id>/outputs/<name>` or `/inputs/<name>`)")


def _one(value: Any, path: str) -> Ref | None:
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ((key, target),) = value.items()
    if key not in ("$ref", "$artifact"):
        return None
    if not isinstance(target, str):
        raise RefError(path, f"{key} must be a string")
    try:
        tokens = parse_pointer(target)
    except RefError as exc:
        raise RefError(path, exc.message) from exc
    if key == "$ref":
        if not (tokens[:1] == ("inputs",) or (len(tokens) >= 3 and tokens[0] == "steps" and tokens[2] == "outputs")):
            raise RefError(path, f"$ref must point into /inputs or /steps/<id>/outputs, not {target!r}")
        return Ref("ref", tokens, path)
    if len(tokens) != 4 or tokens[0] != "steps" or tokens[2] != "artifacts" or not tokens[3]:
        raise RefError(path, f"$artifact must be /steps/<id>/artifacts/<name>, not {target!r}")
    return Ref("artifact", tokens, path)


def refs_in(value: Any, path: str = "", depth: int = 0) -> Iterator[Ref]:
    """Every reference inside an argument value; RefError for a malformed one or too deep a value."""
    if depth > MAX_DEPTH:
        raise RefError(path, f"nested deeper than {MAX_DEPTH} levels")
    ref = _one(value, path)
    if ref is not None:
        yield ref
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from refs_in(item, f"{path}/{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from refs_in(item, f"{path}/{index}", depth + 1)


def nesting(value: Any, depth: int = 0) -> int:
    """How deep a JSON value nests (stops counting past MAX_DEPTH + 1)."""
    if depth > MAX_DEPTH or not isinstance(value, dict | list):
        return depth
    items = value.values() if isinstance(value, dict) else value
    return max((nesting(item, depth + 1) for item in items), default=depth + 1)


def artifact_path(ref: Ref) -> str:
    """Where a referenced artifact is placed in the step's working directory."""
    return f"artifacts/{ref.pointer[1]}/{ref.pointer[3]}"


def resolve(value: Any, state: dict[str, Any], depth: int = 0) -> Any:
    """The argument with every reference replaced (a value, or an artifact's path in the workspace);
    RefError when a referenced value does not exist (an output the step did not emit)."""
    ref = _one(value, "")
    if ref is not None:
        if ref.kind == "artifact":
            return artifact_path(ref)
        return _lookup(state, ref.pointer)
    if isinstance(value, dict):
        return {key: resolve(item, state, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, state, depth + 1) for item in value]
    return value


def _lookup(state: Any, pointer: tuple[str, ...]) -> Any:
    current = state
    for token in pointer:
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            raise RefError("", f"/{'/'.join(pointer)} does not exist in the run's state")
    return current
