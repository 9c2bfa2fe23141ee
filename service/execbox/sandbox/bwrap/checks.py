"""What the bubblewrap helper accepts of a worker: each field of a run's HEAD checked against the
helper's own bounds (execbox.sandbox.bwrap.helper), never taken on the worker's word.

A limit's upper bound is the highest ceiling any policy of the deployment gives it (read from the
policy files when the helper starts): a worker can ask for no more than some request could."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execbox.core.yamltext import YAMLError, safe_load
from execbox.sandbox.protocol import LAUNCHER

# Matched whole (fullmatch): `$` alone would let a trailing newline through.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_LOADER = re.compile(r"LD_.*|GLIBC_TUNABLES|GCONV_PATH|LOCPATH|NLSPATH|MALLOC_.*|HOSTALIASES|RES_OPTIONS|TZDIR")
"""Variables glibc's loader and libc read before a program's code runs: never from a worker."""
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SYSCALL = re.compile(r"[a-z0-9_]{1,64}")
COLLECTABLE = ("", "out")
"""What a run may have collected: the whole workspace or its output directory, nothing deeper."""
LOWS: dict[str, float] = {"cpu": 0.01, "cpu_time_s": 1, "memory_mb": 16, "pids": 1, "disk_mb": 1, "timeout_s": 0.1}
"""Each limit's lowest value (an int where the limit is a whole number)."""
Bounds = Mapping[str, tuple[float, float]]
"""Each limit's (lowest, highest) value."""
_NOT_POLICIES = {"tenants.yaml"}


class BadRun(Exception):
    """The worker's run failed a check; its message goes back in FAILED."""


@dataclass(frozen=True)
class Run:
    image: str
    uid: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cpu: float
    cpu_time_s: int
    memory_mb: int
    pids: int
    disk_mb: int
    timeout_s: float
    collect: str
    seccomp_deny: tuple[str, ...]
    label: str
    """The execution's id: in the helper's log lines and the run's cgroup name."""


class BoundsError(Exception):
    """The policy files give no usable ceilings: the helper must not start."""


def policy_bounds(policies: Path) -> dict[str, tuple[float, float]]:
    """Each limit's bounds: LOWS up to the highest ceiling over every policy file in `policies`
    (default.yaml must give each; a named policy may raise one)."""
    ceilings: dict[str, float] = {}
    default = policies / "default.yaml"
    if not default.is_file():
        raise BoundsError(f"{default} is missing: the helper takes its bounds from the policies' ceilings")
    for path in sorted(policies.glob("*.yaml")):
        if path.name in _NOT_POLICIES:
            continue
        try:
            found = (safe_load(path.read_text()) or {}).get("ceilings") or {}
        except (OSError, YAMLError, AttributeError) as exc:
            raise BoundsError(f"{path}: {exc}") from exc
        for name in LOWS:
            value = found.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                ceilings[name] = max(ceilings.get(name, value), value)
    missing = [name for name in LOWS if name not in ceilings]
    if missing:
        raise BoundsError(f"{default}: ceilings must give {', '.join(missing)}")
    return {name: (low, type(low)(ceilings[name])) for name, low in LOWS.items()}


def checked(head: dict[str, Any], uids: range, bounds: Bounds) -> Run:
    """The run a HEAD asks for, or BadRun naming the field."""
    limits = head.get("limits")
    if not isinstance(limits, dict):
        raise BadRun("limits: an object is required")
    values: dict[str, Any] = {}
    for name, low in LOWS.items():
        high = bounds[name][1]
        value = limits.get(name)
        kind = int if isinstance(low, int) else float
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (kind is int and not isinstance(value, int))
        ):
            raise BadRun(f"limits.{name}: a number is required")
        if not low <= value <= high:
            raise BadRun(f"limits.{name}: {value} is outside {low}..{high}")
        values[name] = kind(value)
    uid = head.get("uid")
    if not isinstance(uid, int) or isinstance(uid, bool) or uid not in uids:
        raise BadRun(f"uid: must be in {uids.start}-{uids.stop - 1}")
    command = head.get("command")
    if (not isinstance(command, list) or not 0 < len(command) <= 32
            or not all(isinstance(a, str) and "\0" not in a and len(a) <= 512 for a in command)
            or tuple(command[: len(LAUNCHER)]) != LAUNCHER):  # fmt: skip
        raise BadRun("command: the launcher's, then the language's (at most 32 arguments)")
    env = head.get("env", [])
    if not isinstance(env, list) or len(env) > 64:
        raise BadRun("env: at most 64 [name, value] pairs")
    pairs = []
    for pair in env:
        if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str) or not isinstance(pair[1], str)
                or not _ENV_NAME.fullmatch(pair[0]) or "\0" in pair[1] or len(pair[1]) > 4096):  # fmt: skip
            raise BadRun("env: each a [NAME, value] pair of strings without NUL")
        if _LOADER.fullmatch(pair[0]):
            raise BadRun(f"env: {pair[0]} is read by the loader or libc before the program: not accepted")
        pairs.append((pair[0], pair[1]))
    deny = head.get("seccomp_deny", [])
    if (
        not isinstance(deny, list)
        or len(deny) > 512
        or not all(isinstance(d, str) and _SYSCALL.fullmatch(d) for d in deny)
    ):
        raise BadRun("seccomp_deny: system call names")
    collect = head.get("collect", "out")
    if collect not in COLLECTABLE:
        raise BadRun('collect: "out" (the output directory) or "" (the whole workspace)')
    image = head.get("image")
    if not isinstance(image, str):
        raise BadRun("image: an image id is required")
    label = head.get("label", "run")
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise BadRun("label: letters, digits, _ and - (the execution's id)")
    return Run(image, uid, tuple(command), tuple(pairs), collect=collect, seccomp_deny=tuple(sorted(set(deny))),
               label=label, **values)  # fmt: skip
