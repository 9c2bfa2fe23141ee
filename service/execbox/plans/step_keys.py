"""A write step's idempotency key: `run:step` by default, or a template over its arguments
(`refund:{args.order_id}`) so that a revision re-adding the same write gets the key of the first.

The key is rendered from the step's resolved arguments when it first dispatches, and the run keeps
which arguments each key was rendered from (a digest): the same key with other arguments is refused,
at the revision when the arguments are literal (422), else when the step would dispatch
(`input.invalid`), since the service the key is forwarded to would take the second write for the first.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from execbox.core.errors import FieldProblem
from execbox.plans.refs import RefError, refs_in

_PLACE = re.compile(r"\{([^{}]*)\}")
_PATH = re.compile(r"^args(\.[A-Za-z0-9_-]+)+$")
MAX_KEY = 200


class KeyProblem(ValueError):
    pass


def default_key(run_id: str, step_id: str) -> str:
    return f"{run_id}:{step_id}"


def template_problem(template: str, args: Mapping[str, Any]) -> str | None:
    """What is wrong with a key template for a step with these (unresolved) arguments, if anything."""
    if "{" not in template:
        return "a key template names at least one argument, e.g. refund:{args.order_id}"
    for path in _PLACE.findall(template):
        if not _PATH.match(path):
            return f"{{{path}}}: a placeholder is {{args.<name>}} or {{args.<name>.<field>}}"
        if path.split(".")[1] not in args:
            return f"{{{path}}}: the step has no argument {path.split('.')[1]!r}"
    if _PLACE.sub("", template).count("{") or _PLACE.sub("", template).count("}"):
        return "unbalanced braces in the key template"
    return None


def render(template: str, args: Mapping[str, Any]) -> str:
    """The key for these resolved arguments; KeyProblem when a path is missing or the key is unusable."""

    def value(match: re.Match[str]) -> str:
        found: Any = {"args": args}
        for part in match.group(1).split("."):
            if not isinstance(found, dict) or part not in found:
                raise KeyProblem(f"the key template's {{{match.group(1)}}} is not in the step's arguments")
            found = found[part]
        return found if isinstance(found, str) else json.dumps(found, sort_keys=True, separators=(",", ":"))

    key = _PLACE.sub(value, template)
    if not 1 <= len(key) <= MAX_KEY or any(not 32 <= ord(c) < 127 for c in key):  # a header value anywhere
        raise KeyProblem(f"the rendered key must be 1-{MAX_KEY} printable ASCII characters")
    return key


def digest(args: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def literal(template: str, args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, digest) of a step whose arguments hold no reference (known before it runs); else None."""
    try:
        if list(refs_in(dict(args), "args")):
            return None
        return render(template, args), digest(args)
    except (RefError, KeyProblem):
        return None


def collisions(steps: Sequence[tuple[str, str, Mapping[str, Any]]], used: Mapping[str, str]) -> list[FieldProblem]:
    """Problems for (field, template, args) of new steps whose literal key another write uses with
    other arguments: one of `used` (key -> digest, the run's), or another new step."""
    found: list[FieldProblem] = []
    seen = dict(used)
    for field, template, args in steps:
        known = literal(template, args)
        if known is None:
            continue
        key, made_from = known
        if seen.setdefault(key, made_from) != made_from:
            found.append(FieldProblem(field, f"key {key!r} is already a write's with other arguments; the service "
                                             "it is forwarded to would take this write for that one"))  # fmt: skip
    return found
