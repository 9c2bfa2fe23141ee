"""Policy resolution: defaults < named policy < request; refusals above a ceiling, never a clamp."""

from __future__ import annotations

from pathlib import Path

import pytest

from execbox.catalog.errors import PolicyExceeded, UnknownPolicy
from execbox.catalog.policies import PolicyConfigError, PolicySet
from execbox.catalog.schemas import PolicyRequest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shipped() -> PolicySet:
    return PolicySet.load(ROOT / "policies")


def test_defaults_apply_when_request_is_empty(shipped: PolicySet) -> None:
    applied = shipped.resolve(PolicyRequest(), code_bytes=10)
    assert applied.name == "default"
    assert (applied.timeout_s, applied.memory_mb, applied.pids, applied.network) == (10, 256, 64, "none")


def test_request_overrides_default_within_ceiling(shipped: PolicySet) -> None:
    applied = shipped.resolve(PolicyRequest(timeout_s=120, memory_mb=2048), code_bytes=10)
    assert applied.timeout_s == 120 and applied.memory_mb == 2048


def test_above_ceiling_is_refused_with_field_and_ceiling(shipped: PolicySet) -> None:
    with pytest.raises(PolicyExceeded) as caught:
        shipped.resolve(PolicyRequest(timeout_s=121, pids=1000), code_bytes=10)
    problems = {p.field: p.message for p in caught.value.problems}
    assert set(problems) == {"policy.timeout_s", "policy.pids"}
    assert "ceiling 120" in problems["policy.timeout_s"] and "ceiling 256" in problems["policy.pids"]


def test_code_above_ceiling_is_refused(shipped: PolicySet) -> None:
    with pytest.raises(PolicyExceeded) as caught:
        shipped.resolve(PolicyRequest(), code_bytes=2 << 20)
    assert caught.value.problems[0].field == "code"


def test_named_policy_layers_over_default(shipped: PolicySet) -> None:
    applied = shipped.resolve(PolicyRequest(name="large", memory_mb=8192), code_bytes=10)
    assert applied.name == "large" and applied.memory_mb == 8192
    assert applied.timeout_s == 60  # large's default
    assert applied.pids == 64  # inherited from default.yaml


def test_unknown_policy(shipped: PolicySet) -> None:
    with pytest.raises(UnknownPolicy) as caught:
        shipped.resolve(PolicyRequest(name="nope"), code_bytes=1)
    assert "default" in caught.value.message and "large" in caught.value.message


def test_default_above_ceiling_fails_at_load(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text((ROOT / "policies" / "default.yaml").read_text())
    (tmp_path / "bad.yaml").write_text("defaults:\n  timeout_s: 500\n")
    with pytest.raises(PolicyConfigError, match="above its ceiling"):
        PolicySet.load(tmp_path)


def test_unknown_key_fails_at_load(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("defaults:\n  timeout: 5\n")
    with pytest.raises(PolicyConfigError):
        PolicySet.load(tmp_path)
