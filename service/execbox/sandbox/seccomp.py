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
        """Read at start-up: a worker without its profile must not start (it would run sandboxes under
        whatever the engine allows)."""
        try:
            self._base: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"the seccomp profile {path} is unreadable ({exc}); scripts/seccomp-profile makes it"
            ) from exc
        self._cache: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()

    def base(self) -> dict[str, Any]:
        return self._base

    def json(self, deny: tuple[str, ...] = (), gvisor: bool = False) -> str:
        """The profile as the engine takes it (its JSON text), with `deny` taken out of every rule;
        for gVisor, see for_gvisor."""
        key = (*sorted(set(deny)), "+gvisor" if gvisor else "")
        with self._lock:
            if key not in self._cache:
                profile = narrowed(self.base(), tuple(sorted(set(deny))))
                self._cache[key] = json.dumps(for_gvisor(profile) if gvisor else profile, separators=(",", ":"))
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


def for_gvisor(profile: dict[str, Any]) -> dict[str, Any]:
    """Under gVisor the profile filters the program's calls to gVisor's own kernel (runsc
    --oci-seccomp), and none reaches the host's. clone3 is then allowed: Docker's profile answers it
    ENOSYS so that glibc falls back to clone (whose namespace flags seccomp can see), but gVisor
    (2022-12) answers EPERM instead and no thread can start; gVisor's clone3 creates nothing on the host."""
    result = copy.deepcopy(profile)
    result["syscalls"] = [
        r for r in result["syscalls"] if "clone3" not in r["names"] or r["action"] == "SCMP_ACT_ALLOW"
    ]
    result["syscalls"].append({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"})
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


__all__ = ["SeccompProfiles", "allowed", "for_gvisor", "narrowed"]
