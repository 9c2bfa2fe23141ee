"""The BPF program for bubblewrap, compiled from the real profile (policies/seccomp.json) and loaded
by the real bwrap on this kernel. Needs root and bubblewrap; no Docker, no Redis.

Each sandbox runs the host's own /usr/bin/python3 over a read-only view of the host's root, in new
PID and network namespaces, with a fresh /proc, /dev and a writable /tmp.
"""

from __future__ import annotations

import ctypes
import errno
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from execbox.sandbox.bwrap import seccomp_bpf
from execbox.sandbox.bwrap.seccomp_bpf import compile_profile
from execbox.sandbox.seccomp import SeccompProfiles, narrowed

PROFILE = Path(__file__).resolve().parents[2] / "policies" / "seccomp.json"
CALLS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(result):
    return 0 if result >= 0 else ctypes.get_errno()
unshare = errno_of(libc.unshare(0x10000000))  # CLONE_NEWUSER
clone3 = errno_of(libc.syscall(435, None, 0))  # clone3 (the same number on x86_64 and aarch64)
print(unshare, clone3)
"""
MKDIR = """
import os
try:
    os.mkdir("/tmp/made")
    print(0)
except OSError as exc:
    print(exc.errno)
"""


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return SeccompProfiles(PROFILE).base()


@pytest.fixture(scope="module")
def base_program(base: dict[str, Any]) -> bytes:
    return compile_profile(base)


def sandboxed(program: bytes | None, code: str) -> subprocess.CompletedProcess[str]:
    """`python3 -c code` under bwrap, with `program` as its seccomp filter (None: no filter)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.fail("bubblewrap (bwrap) is not on PATH: scripts/install installs bubblewrap")
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    with tempfile.TemporaryFile() as source:
        if program is not None:
            source.write(program)
            source.flush()
            source.seek(0)
            argv += ["--seccomp", str(source.fileno())]
        return subprocess.run(
            [*argv, "--", "/usr/bin/python3", "-c", code],
            pass_fds=(source.fileno(),) if program is not None else (),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def test_the_program_is_an_array_of_sock_filter(base_program: bytes) -> None:
    assert base_program and len(base_program) % 8 == 0


def test_an_allowed_program_runs(base_program: bytes) -> None:
    ran = sandboxed(base_program, "print(1)")
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "1\n", "")


def test_the_profile_denies_what_it_leaves_out(base_program: bytes) -> None:
    """unshare is allowed only with CAP_SYS_ADMIN (the sandbox has none): the default action, EPERM.
    clone3 has a rule of its own answering ENOSYS (glibc then falls back to clone). Without the
    filter both calls get past seccomp, so the errors below are the program's."""
    unfiltered = sandboxed(None, CALLS)
    assert unfiltered.returncode == 0, unfiltered.stderr
    assert unfiltered.stdout.split() == ["0", str(errno.EINVAL)]  # clone3 refuses a zero-sized argument
    filtered = sandboxed(base_program, CALLS)
    assert filtered.returncode == 0, filtered.stderr
    assert filtered.stdout.split() == [str(errno.EPERM), str(errno.ENOSYS)]


def test_a_narrowed_profile_denies_mkdir(base: dict[str, Any], base_program: bytes) -> None:
    # glibc's mkdir() is the mkdir call on x86_64 and mkdirat on aarch64 (which has no mkdir).
    assert sandboxed(base_program, MKDIR).stdout == "0\n"
    assert sandboxed(compile_profile(narrowed(base, ("mkdir", "mkdirat"))), MKDIR).stdout == f"{errno.EPERM}\n"


def profile(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": list(rules)}


def test_what_the_program_cannot_express_is_refused() -> None:
    with pytest.raises(ValueError, match="SCMP_ACT_BOGUS"):
        compile_profile(profile({"names": ["read"], "action": "SCMP_ACT_BOGUS"}))
    with pytest.raises(ValueError, match="SCMP_CMP_BOGUS"):
        compile_profile(
            profile({"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "op": "SCMP_CMP_BOGUS"}]})
        )
    same_condition = {"names": ["mkdir"], "args": [{"index": 1, "value": 0o700, "op": "SCMP_CMP_EQ"}]}
    with pytest.raises(ValueError, match="mkdir: EEXIST"):  # one condition, two actions
        compile_profile(
            profile({**same_condition, "action": "SCMP_ACT_ALLOW"}, {**same_condition, "action": "SCMP_ACT_LOG"})
        )


def test_names_libseccomp_does_not_know_and_rules_restating_the_default_are_skipped() -> None:
    alone = compile_profile(profile({"names": ["read"], "action": "SCMP_ACT_ALLOW"}))
    assert (
        compile_profile(
            profile(
                {"names": ["read", "no_such_call"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["write"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
            )
        )
        == alone
    )


def test_a_missing_libseccomp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(seccomp_bpf, "_lib", None)
    monkeypatch.setattr(ctypes, "CDLL", missing)
    with pytest.raises(RuntimeError, match=r"libseccomp\.so\.2 cannot be loaded"):
        compile_profile(profile())
