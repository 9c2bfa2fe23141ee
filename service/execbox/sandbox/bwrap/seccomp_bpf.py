"""The sandboxes' seccomp profile (Docker's JSON format, policies/seccomp.json) compiled into the
classic-BPF program `bwrap --seccomp FD` loads: an array of struct sock_filter, as libseccomp's
seccomp_export_bpf writes it.

The rules go through libseccomp because that is the library Docker's runtime (runc) hands the same
profile to, so a bubblewrap sandbox is filtered as a Docker one is. It is reached through ctypes:
Debian ships libseccomp.so.2 (package libseccomp2), and the Python bindings on PyPI are not kept up.

The profile is read as Docker reads it for a process with no capabilities on the running kernel
(moby's profiles/seccomp), and its rules are added as runc adds them. The program covers the native
architecture only: a call made through another ABI (32-bit x86, x32) meets libseccomp's bad-arch
action (the thread is killed) instead of the profile.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from typing import Any

_ACTIONS = {
    "SCMP_ACT_KILL": 0x00000000,
    "SCMP_ACT_KILL_THREAD": 0x00000000,
    "SCMP_ACT_KILL_PROCESS": 0x80000000,
    "SCMP_ACT_TRAP": 0x00030000,
    "SCMP_ACT_LOG": 0x7FFC0000,
    "SCMP_ACT_ALLOW": 0x7FFF0000,
}
_WITH_CODE = {"SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000}
"""Actions that carry a 16-bit value (the errno returned, the tracer's message): a rule's is EPERM unless it
gives `errnoRet`, as in runc (the profile's `defaultErrnoRet` is the default action's only)."""
_OPERATORS = {f"SCMP_CMP_{op}": n for n, op in enumerate(("NE", "LT", "LE", "EQ", "GE", "GT", "MASKED_EQ"), 1)}
_ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
"""uname's machine name -> the spelling of the profile's includes/excludes `arches` (Go's GOARCH)."""
_UNKNOWN_NAME = -1  # __NR_SCMP_ERROR
_OPTIMIZE = 8  # SCMP_FLTATR_CTL_OPTIMIZE


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


_lib: ctypes.CDLL | None = None


def _libseccomp() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libseccomp.so.2")
        except OSError as exc:
            raise RuntimeError(f"libseccomp.so.2 cannot be loaded ({exc}); Debian's libseccomp2 has it") from exc
        lib.seccomp_init.argtypes, lib.seccomp_init.restype = [ctypes.c_uint32], ctypes.c_void_p
        lib.seccomp_release.argtypes, lib.seccomp_release.restype = [ctypes.c_void_p], None
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        add = lib.seccomp_rule_add_array
        add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
        lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        _lib = lib
    return _lib


def compile_profile(profile: dict[str, Any]) -> bytes:
    """The BPF program for `profile` on this host's architecture (x86_64 or aarch64). ValueError for
    what the profile gets wrong (an unknown action or operator, a rule libseccomp refuses)."""
    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        raise RuntimeError(f"no seccomp program for the {os.uname().machine} architecture (x86_64, aarch64 only)")
    default = _action(profile.get("defaultAction"), profile.get("defaultErrnoRet"))
    rules = [(rule, _action(rule.get("action"), rule.get("errnoRet"))) for rule in profile.get("syscalls") or []]
    lib = _libseccomp()
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise RuntimeError("seccomp_init failed")
    try:
        if len(rules) > 32:  # a binary search over the call numbers, as runc asks for (older libseccomp lacks it)
            lib.seccomp_attr_set(ctx, _OPTIMIZE, 2)
        for rule, action in rules:
            if action == default or not _applies(rule, arch):  # restating the default: a no-op libseccomp refuses
                continue
            for name in rule.get("names") or ([rule["name"]] if rule.get("name") else []):
                _add(lib, ctx, name, action, rule.get("args") or [])
        with os.fdopen(os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC), "w+b") as out:
            if (rc := lib.seccomp_export_bpf(ctx, out.fileno())) < 0:
                raise RuntimeError(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(ctx)


def _action(name: Any, code: Any) -> int:
    if name in _ACTIONS:
        return _ACTIONS[name]
    if name in _WITH_CODE:
        return _WITH_CODE[name] | ((errno.EPERM if code is None else int(code)) & 0xFFFF)
    raise ValueError(f"the seccomp action {name!r} is unknown (or not supported for bubblewrap)")


def _applies(rule: dict[str, Any], arch: str) -> bool:
    """Docker's filter for a process holding no capability: an `includes.caps` rule never applies,
    an `excludes.caps` rule always does."""
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if arch in (excludes.get("arches") or []):
        return False
    if excludes.get("minKernel") and _kernel_at_least(excludes["minKernel"]):
        return False
    if includes.get("arches") and arch not in includes["arches"]:
        return False
    if includes.get("caps"):
        return False
    return not includes.get("minKernel") or _kernel_at_least(includes["minKernel"])


def _kernel_at_least(version: str) -> bool:
    """Major and minor only, as Docker compares them ("6.1" <= "6.1.0-18-amd64")."""

    def parsed(text: str) -> tuple[int, int]:
        if not (found := re.match(r"(\d+)\.(\d+)", text)):
            raise ValueError(f"the kernel version {text!r} is not MAJOR.MINOR")
        return int(found[1]), int(found[2])

    return parsed(version) <= parsed(os.uname().release)


def _add(lib: ctypes.CDLL, ctx: int, name: str, action: int, args: list[dict[str, Any]]) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number == _UNKNOWN_NAME:
        return  # newer than this libseccomp: left to the default action, as runc does
    conditions = []
    for arg in args:
        if arg.get("op") not in _OPERATORS:
            raise ValueError(f"the seccomp operator {arg.get('op')!r} (for {name}) is unknown")
        conditions.append(_ArgCmp(arg["index"], _OPERATORS[arg["op"]], arg.get("value", 0), arg.get("valueTwo", 0)))
    # As runc: several conditions on one argument become one rule each (any of them matches).
    indexes = [c.arg for c in conditions]
    for group in [[c] for c in conditions] if len(set(indexes)) < len(indexes) else [conditions]:
        rc = lib.seccomp_rule_add_array(ctx, action, number, len(group), (_ArgCmp * len(group))(*group))
        if rc < 0:
            code = errno.errorcode.get(-rc, str(-rc))
            raise ValueError(f"libseccomp refused a rule for {name}: {code} ({os.strerror(-rc)})")


__all__ = ["compile_profile"]
