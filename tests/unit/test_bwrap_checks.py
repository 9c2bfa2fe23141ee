"""The bubblewrap helper's HEAD checks (execbox.sandbox.bwrap.checks.checked), from the attacker's
side: the worker is assumed compromised, so every field of its HEAD is hostile. Each hostile HEAD
must be refused with BadRun naming the field; a well-formed one is accepted.

Pure logic: no root, no bwrap, no Docker.

The tests under "accepted today, must be refused" fail against the current checks on purpose:
each is a HEAD that `checked` lets through although it should not (see the review report).
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest

from execbox.sandbox.bwrap.checks import BadRun, BoundsError, Run, checked, policy_bounds
from execbox.sandbox.protocol import LAUNCHER

ROOT = Path(__file__).resolve().parents[2]
UIDS = range(200_000, 300_000)
BOUNDS = policy_bounds(ROOT / "policies")
"""The shipped policies' highest ceilings, as the helper reads them at start."""
IMAGE = "sha256:" + "ab" * 32
LIMITS: dict[str, Any] = {"cpu": 1.0, "cpu_time_s": 10, "memory_mb": 256, "pids": 64, "disk_mb": 64, "timeout_s": 10.0}


class _Missing:
    """A HEAD change that removes the field."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def good_head() -> dict[str, Any]:
    """A HEAD as the real worker sends it (execbox.sandbox.bwrap.runtime)."""
    return {
        "image": IMAGE,
        "uid": 200_123,
        "label": "exe_0123abcd",
        "command": [*LAUNCHER, "python3", "-u", "main.py"],
        "env": [["PATH", "/usr/local/bin:/usr/bin:/bin"], ["HOME", "/tmp"], ["TMPDIR", "/tmp"], ["LANG", "C.UTF-8"]],
        "limits": dict(LIMITS),
        "collect": "out",
        "seccomp_deny": ["ptrace", "mknod"],
    }


def hostile(**changes: Any) -> dict[str, Any]:
    head = copy.deepcopy(good_head())
    for name, value in changes.items():
        if value is _MISSING:
            head.pop(name, None)
        else:
            head[name] = value
    return head


def with_limit(name: str, value: Any) -> dict[str, Any]:
    limits = dict(LIMITS)
    if value is _MISSING:
        limits.pop(name)
    else:
        limits[name] = value
    return hostile(limits=limits)


def refused(head: dict[str, Any], field: str) -> BadRun:
    """checked(head) raises BadRun whose message starts with the field's name."""
    with pytest.raises(BadRun, match=rf"^{re.escape(field)}:") as caught:
        checked(head, UIDS, BOUNDS)
    return caught.value


# --- a valid HEAD ----------------------------------------------------------------------------


def test_the_workers_own_head_is_accepted() -> None:
    run = checked(good_head(), UIDS, BOUNDS)
    assert isinstance(run, Run)
    assert run.image == IMAGE
    assert run.uid == 200_123
    assert run.command == (*LAUNCHER, "python3", "-u", "main.py")
    assert run.env[0] == ("PATH", "/usr/local/bin:/usr/bin:/bin")
    limits = (run.cpu, run.cpu_time_s, run.memory_mb, run.pids, run.disk_mb, run.timeout_s)
    assert limits == (1.0, 10, 256, 64, 64, 10.0)
    assert run.collect == "out"
    assert run.seccomp_deny == ("mknod", "ptrace")  # sorted, as the helper's program cache keys them
    assert run.label == "exe_0123abcd"


def test_optional_fields_take_their_defaults() -> None:
    run = checked(hostile(env=_MISSING, collect=_MISSING, seccomp_deny=_MISSING, label=_MISSING), UIDS, BOUNDS)
    assert (run.env, run.collect, run.seccomp_deny, run.label) == ((), "out", (), "run")


def test_bounds_are_inclusive_and_an_int_cpu_is_a_float() -> None:
    low = {"cpu": 0.01, "cpu_time_s": 1, "memory_mb": 16, "pids": 1, "disk_mb": 1, "timeout_s": 0.1}
    high = {"cpu": 2, "cpu_time_s": 1800, "memory_mb": 8192, "pids": 256, "disk_mb": 2048, "timeout_s": 900}
    assert checked(hostile(limits=low), UIDS, BOUNDS).memory_mb == 16
    run = checked(hostile(limits=high), UIDS, BOUNDS)
    assert isinstance(run.cpu, float) and isinstance(run.timeout_s, float)
    assert checked(hostile(uid=UIDS.start), UIDS, BOUNDS).uid == UIDS.start
    assert checked(hostile(uid=UIDS.stop - 1), UIDS, BOUNDS).uid == UIDS.stop - 1


def test_the_whole_workspace_may_be_collected() -> None:
    assert checked(hostile(collect=""), UIDS, BOUNDS).collect == ""


def test_duplicate_denials_collapse() -> None:
    assert checked(hostile(seccomp_deny=["ptrace", "ptrace"]), UIDS, BOUNDS).seccomp_deny == ("ptrace",)


# --- uid -------------------------------------------------------------------------------------


BAD_UIDS = [0, 1, 65534, 1000, UIDS.start - 1, UIDS.stop, 2**31, -1, -UIDS.start, True, False, 200_123.0, "200123",
            None, [200_123], _MISSING]  # fmt: skip


@pytest.mark.parametrize("uid", BAD_UIDS, ids=repr)
def test_a_uid_outside_the_range_or_not_an_int_is_refused(uid: Any) -> None:
    refused(hostile(uid=uid), "uid")


# --- command ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["/bin/sh", "-c", "id"],
        ["/usr/bin/python3", "-I", "-S", "/opt/execbox/launch.py", "python3"],  # not the launcher's binary
        ["/usr/bin/python3-launcher", "-c", "import os; os.system('sh')"],  # an option instead of the script
        ["/usr/bin/python3-launcher", "-S", "/opt/execbox/launch.py", "python3"],  # without -I (isolated mode)
        ["/usr/bin/python3-launcher", "-I", "-S", "-c", "print(1)", "/opt/execbox/launch.py"],
        ["/usr/bin/python3-launcher", "-I", "-S", "/workspace/launch.py", "python3"],  # a script the job wrote
        ["/usr/bin/python3-launcher", "-S", "-I", "/opt/execbox/launch.py"],  # reordered
        [f"{LAUNCHER[0]} ", *LAUNCHER[1:], "python3"],  # a look-alike path
        ["--", *LAUNCHER, "python3"],  # an option for bwrap or setpriv before the launcher
        ["--setenv", "LD_PRELOAD", "/x.so", *LAUNCHER],
        list(LAUNCHER[:3]),  # a prefix of the launcher
        [],
        "/usr/bin/python3-launcher -I -S /opt/execbox/launch.py python3",  # a string, not argv
        list(LAUNCHER) + ["x"] * (33 - len(LAUNCHER)),  # 33 arguments
        [*LAUNCHER, "python3", "a\0b"],  # NUL: execve would cut it
        [*LAUNCHER, "python3", "x" * 513],
        [*LAUNCHER, "python3", 1],
        [*LAUNCHER, None],
        None,
        _MISSING,
    ],
    ids=repr,
)
def test_a_command_other_than_the_launchers_is_refused(command: Any) -> None:
    refused(hostile(command=command), "command")


def test_thirty_two_arguments_are_the_most() -> None:
    command = list(LAUNCHER) + ["x"] * (32 - len(LAUNCHER))
    assert len(checked(hostile(command=command), UIDS, BOUNDS).command) == 32


# --- env -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "1ABC", "A-B", "A=B", "A B", "-A", "--chdir", "--unshare-all", "A\0B", "É", "A.B", "A/B", "$A", "A" * 129],
    ids=repr,
)
def test_an_env_name_that_is_not_an_identifier_is_refused(name: str) -> None:
    refused(hostile(env=[[name, "x"]]), "env")


@pytest.mark.parametrize(
    "env",
    [
        [["PATH", "/bin\0/evil"]],  # NUL in a value
        [["PATH", "x" * 4097]],
        [["PATH", "/bin", "extra"]],
        [["PATH"]],
        [[]],
        [("PATH", "/bin")],  # not a list pair (never from JSON, but a dict HEAD from elsewhere)
        [{"PATH": "/bin"}],
        ["PATH=/bin"],
        [[1, "x"]],
        [["PATH", 1]],
        [["PATH", None]],
        {"PATH": "/bin"},
        "PATH=/bin",
        None,
        [["V", "x"]] * 65,
    ],
    ids=lambda env: repr(env)[:60],
)
def test_a_malformed_env_is_refused(env: Any) -> None:
    refused(hostile(env=env), "env")


def test_sixty_four_pairs_and_long_values_are_accepted() -> None:
    env = [[f"V{i}", "x" * 4096] for i in range(64)]
    assert len(checked(hostile(env=env), UIDS, BOUNDS).env) == 64


# --- collect ---------------------------------------------------------------------------------


BAD_COLLECTS = ["..", "../..", "../etc", "out/..", "out/../..", "out/../../../../etc", "/", "/etc", "/workspace/out",
                "out/", "a//b", "//", "out\0", "~root", "out/*", "out dir", "out\\..\\..", "$HOME", 1, None,
                ["out"]]  # fmt: skip


@pytest.mark.parametrize("collect", BAD_COLLECTS, ids=repr)
def test_a_collect_path_outside_the_workspace_is_refused(collect: Any) -> None:
    refused(hostile(collect=collect), "collect")


# --- label -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    ["", "a/b", "../x", "..", ".", "a.b", "x" * 65, "a b", "a\0", "a\nb", "exe:1", "*", 1, None, ["exe"]],
    ids=repr,
)
def test_a_label_that_is_not_a_plain_name_is_refused(label: Any) -> None:
    refused(hostile(label=label), "label")


# --- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", [None, [], "cpu=1", 1, _MISSING], ids=repr)
def test_limits_must_be_an_object(limits: Any) -> None:
    refused(hostile(limits=limits), "limits")


OUT_OF_BOUNDS = [
    ("cpu", 0.0), ("cpu", 0.009), ("cpu", 2.01), ("cpu", 64.0), ("cpu", -1.0), ("cpu", 1e308),
    ("cpu_time_s", 0), ("cpu_time_s", 1801), ("cpu_time_s", 86_400), ("cpu_time_s", -1),
    ("memory_mb", 15), ("memory_mb", 8193), ("memory_mb", 65_536), ("memory_mb", 0), ("memory_mb", -(1 << 20)),
    ("pids", 0), ("pids", 257), ("pids", 4096), ("pids", -1),
    ("disk_mb", 0), ("disk_mb", 2049), ("disk_mb", 65_536), ("disk_mb", 2**63),
    ("timeout_s", 0.0), ("timeout_s", 0.09), ("timeout_s", 900.5), ("timeout_s", 86_400.0), ("timeout_s", -5.0),
]  # fmt: skip
"""Above the shipped policies' highest ceilings: 86,400 s, 64 GiB and 4,096 pids passed the old fixed bounds."""


@pytest.mark.parametrize(("name", "value"), OUT_OF_BOUNDS, ids=repr)
def test_a_limit_outside_its_bounds_is_refused(name: str, value: Any) -> None:
    refused(with_limit(name, value), f"limits.{name}")


WRONG_TYPES = [
    *((name, value) for name in LIMITS for value in (True, False, "1", None, [1], {"v": 1}, _MISSING)),
    *((name, 10.0) for name in ("cpu_time_s", "memory_mb", "pids", "disk_mb")),  # integers only
    *((name, value) for name in LIMITS for value in (math.nan, math.inf, -math.inf)),
]


@pytest.mark.parametrize(("name", "value"), WRONG_TYPES, ids=repr)
def test_a_limit_of_the_wrong_type_is_refused(name: str, value: Any) -> None:
    refused(with_limit(name, value), f"limits.{name}")


# --- seccomp_deny ----------------------------------------------------------------------------


ODD_DENIALS = [["READ"], ["read;"], ["read write"], ["read,write"], ["../x"], [""], ["a" * 65], ["read\0"],
               ["read-write"], ["*"], ["$(id)"], [1], [None], "read", {"read": True}, None, ["read"] * 513]  # fmt: skip


@pytest.mark.parametrize("deny", ODD_DENIALS, ids=lambda deny: repr(deny)[:60])
def test_seccomp_denials_with_odd_names_are_refused(deny: Any) -> None:
    refused(hostile(seccomp_deny=deny), "seccomp_deny")


# --- image -----------------------------------------------------------------------------------


@pytest.mark.parametrize("image", [_MISSING, None, 1, ["sha256:" + "0" * 64], {"id": IMAGE}], ids=repr)
def test_a_missing_image_is_refused(image: Any) -> None:
    refused(hostile(image=image), "image")


# --- accepted today, must be refused (these fail until the checks are fixed) ------------------
#
# The checks' patterns end in `$` and are applied with re.match: `$` also matches just before a
# final newline, so each check passes a value with a trailing "\n" that is not what it allows.


def test_an_env_name_with_a_trailing_newline_is_refused() -> None:
    """`PATH\\n` is no identifier: bwrap --setenv puts `PATH\\n=...` into the environment."""
    refused(hostile(env=[["PATH\n", "/workspace"]]), "env")


def test_a_label_with_a_trailing_newline_is_refused() -> None:
    """The label names the run's cgroup directory (split by the helper's `for f in $EBX_CGROUPS`)
    and goes into the root helper's log lines, where a newline forges a line."""
    refused(hostile(label="exe_1\n"), "label")


def test_a_collect_path_with_a_trailing_newline_is_refused() -> None:
    refused(hostile(collect="out\n"), "collect")


def test_a_seccomp_name_with_a_trailing_newline_is_refused() -> None:
    refused(hostile(seccomp_deny=["ptrace\n"]), "seccomp_deny")


@pytest.mark.parametrize(
    "name",
    ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GLIBC_TUNABLES", "GCONV_PATH", "LOCPATH"],
)
def test_a_loader_variable_is_refused(name: str) -> None:
    """bwrap applies --setenv to its own environment and, run as real root without --cap-drop,
    keeps every capability for its child: the env reaches /usr/bin/setpriv running as uid 0 with
    all capabilities, before the drop and without AT_SECURE, so the dynamic loader honours these
    (the variables glibc itself strips for privileged programs)."""
    refused(hostile(env=[[name, "/usr/lib/x86_64-linux-gnu/libc.so.6"]]), "env")


@pytest.mark.parametrize("collect", ["link/etc", "out/deeper", "a/b/c"])
def test_a_nested_collect_path_is_refused(collect: str) -> None:
    """The helper tars /workspace/<collect> as root from the host side and checks only the last
    component for a link: a program that makes /workspace/link -> / and a worker that asks for
    `link/etc` get the host's /etc. The worker itself only ever asks for "out" or "" (the whole
    workspace), so a path with more than one component has no use but this."""
    refused(hostile(collect=collect), "collect")


# --- bounds from the policies ----------------------------------------------------------------


def test_the_helpers_bounds_are_the_policies_highest_ceilings(tmp_path: Path) -> None:
    """A worker may ask the helper for no more than some policy lets a request ask for: the highest
    ceiling over every policy file (a named policy may raise default.yaml's)."""
    (tmp_path / "default.yaml").write_text(
        "ceilings: {timeout_s: 120, cpu: 2.0, cpu_time_s: 240, memory_mb: 2048, pids: 256, disk_mb: 512}\n"
    )
    (tmp_path / "large.yaml").write_text("ceilings: {timeout_s: 900, memory_mb: 8192}\n")
    (tmp_path / "tenants.yaml").write_text("tenants: {}\n")
    bounds = policy_bounds(tmp_path)
    assert bounds["timeout_s"] == (0.1, 900.0) and bounds["memory_mb"] == (16, 8192)
    assert bounds["pids"] == (1, 256) and isinstance(bounds["pids"][1], int)
    assert checked(with_limit("memory_mb", 8192), UIDS, bounds).memory_mb == 8192
    refused_with = pytest.raises(BadRun, match=r"^limits.memory_mb: 8193 is outside 16..8192")
    with refused_with:
        checked(with_limit("memory_mb", 8193), UIDS, bounds)


def test_without_the_policies_ceilings_the_helper_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(BoundsError, match="default.yaml is missing"):
        policy_bounds(tmp_path)
    (tmp_path / "default.yaml").write_text("ceilings: {timeout_s: 120}\n")
    with pytest.raises(BoundsError, match="ceilings must give cpu, cpu_time_s, memory_mb, pids, disk_mb"):
        policy_bounds(tmp_path)
