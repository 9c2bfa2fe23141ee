"""execbox's seccomp profile (policies/seccomp.json) and how policies narrow it."""

from __future__ import annotations

import json
from pathlib import Path

from execbox.sandbox.seccomp import SeccompProfiles, allowed, for_gvisor, narrowed

PROFILE = Path(__file__).resolve().parents[2] / "policies" / "seccomp.json"


def test_profile_denies_io_uring_and_all_but_three_socket_families() -> None:
    profile = json.loads(PROFILE.read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    calls = allowed(profile)
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "socketcall", "userfaultfd",
                 "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "init_module"):  # fmt: skip
        assert all("caps" in c.get("includes", {}) for c in calls.get(name, [])), name  # only with a capability
    families = sorted(c["args"][0]["value"] for c in calls["socket"])
    assert families == [1, 2, 10] and all(c["args"][0]["op"] == "SCMP_CMP_EQ" for c in calls["socket"])


def test_a_policy_can_only_narrow_the_profile(tmp_path: Path) -> None:
    profiles = SeccompProfiles(PROFILE)
    base = allowed(profiles.base())
    strict = allowed(json.loads(profiles.json(("ptrace", "personality"))))
    assert "ptrace" in base and "ptrace" not in strict and "personality" not in strict
    assert set(strict) <= set(base)
    assert narrowed(profiles.base(), ()) == profiles.base()


def test_the_gvisor_variant_differs_only_in_clone3() -> None:
    base = json.loads(PROFILE.read_text())
    gvisor = for_gvisor(base)
    assert {} in allowed(gvisor)["clone3"] and {} not in allowed(base).get(
        "clone3", []
    )  # unconditional: gVisor's own clone3, never the host's
    strip = [r for r in gvisor["syscalls"] if "clone3" not in r["names"]]
    assert strip == [r for r in base["syscalls"] if "clone3" not in r["names"]]
