"""Tenant quotas end to end: the rate per minute on the real API process. Executions at once, allowed
policies and the queue's depth run on the in-process stack (tests/unit/test_quotas.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import Side, auth, create_key, policies_with_tenants

pytestmark = [pytest.mark.redis]
BODY = {"language": "python", "code": "print(1)"}


@pytest.fixture
def limited(side_stack: Callable[..., Side], tmp_path: Path) -> tuple[Side, dict[str, str]]:
    policies = policies_with_tenants(
        tmp_path,
        "default: {running: 100, per_minute: 1000, policies: [default, large]}\n"
        "tenants:\n"
        "  rated: {running: 100, per_minute: 3, policies: [default]}\n",
    )
    side = side_stack(EXECBOX_POLICIES_DIR=str(policies))  # no worker: accepted executions stay queued
    keys = {tenant: create_key(side.env, tenant) for tenant in ("rated", "other")}
    return side, keys


def test_tenant_over_its_rate_gets_429_while_another_is_served(limited: tuple[Side, dict[str, str]]) -> None:
    side, keys = limited
    with httpx.Client(base_url=side.base_url, timeout=30) as http:
        accepted = [http.post("/v1/executions", json=BODY, headers=auth(keys["rated"])) for _ in range(3)]
        assert [r.status_code for r in accepted] == [202, 202, 202]
        assert [r.headers["ratelimit-remaining"] for r in accepted] == ["2", "1", "0"]
        refused = http.post("/v1/executions", json=BODY, headers=auth(keys["rated"]))
        other = http.post("/v1/executions", json=BODY, headers=auth(keys["other"]))
    assert refused.status_code == 429 and refused.json()["code"] == "rate_limited" and refused.json()["retryable"]
    assert refused.headers["ratelimit-limit"] == "3" and refused.headers["ratelimit-remaining"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["retry-after"] == refused.headers["ratelimit-reset"]
    assert other.status_code == 202
