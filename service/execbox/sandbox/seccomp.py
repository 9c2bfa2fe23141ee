"""The sandboxes' seccomp profile: execbox's own (policies/seccomp.json), never the engine's default.

The profile is Docker's default narrowed by scripts/seccomp-profile (no io_uring, sockets of the
UNIX, INET and INET6 families only, no socketcall). A policy may deny more system calls
(`seccomp_deny`); nothing can allow more, because a narrowed profile is made by removing names
from the base profile's allow rules.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any


class SeccompProfiles:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._base: dict[str, Any] | None = None
        self._cache: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()

    def base(self) -> dict[str, Any]:
        if self._base is None:
            self._base = json.loads(self._path.read_text())
        return self._base

    def json(self, deny: tuple[str, ...] = ()) -> str:
        """The profile as the engine takes it (its JSON text), with `deny` taken out of every rule."""
        key = tuple(sorted(set(deny)))
        with self._lock:
            if key not in self._cache:
                self._cache[key] = json.dumps(narrowed(self.base(), key), separators=(",", ":"))
            return self._cache[key]


def narrowed(profile: dict[str, Any], deny: tuple[str, ...]) -> dict[str, Any]:
    result = copy.deepcopy(profile)
    rules = []
    for rule in result["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            rule["names"] = [n for n in rule["names"] if n not in deny]
            if not rule["names"]:
                continue
        rules.append(rule)
    result["syscalls"] = rules
    return result


def allowed(profile: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each name some ALLOW rule admits, with the conditions of those rules (for tests and review)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            for name in rule["names"]:
                found.setdefault(name, []).append(
                    {k: rule.get(k) for k in ("args", "includes", "excludes") if rule.get(k)}
                )
    return found


__all__ = ["SeccompProfiles", "allowed", "narrowed"]
