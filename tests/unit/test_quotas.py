"""Tenant quotas through the API of the in-process stack (tests/unit/stack.py): executions at once,
allowed policies, and the queue's depth. Moved from tests/integration/test_quotas.py (issue 45),
which keeps the rate-per-minute 429 on the real deployment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Redis, policies_with_tenants
from tests.unit.stack import InStack, in_stack

pytestmark = pytest.mark.redis
BODY = {"language": "python", "code": "print(1)"}


@pytest.fixture
def limited(redis_server: Redis, tmp_path: Path) -> Iterator[InStack]:
    """A stack whose tenants.yaml gives `narrow` two executions at once and the default policy only;
    any other tenant has the default quotas (default and large). No worker runs unless stepped."""
    policies = policies_with_tenants(
        tmp_path,
        "default: {running: 100, per_minute: 1000, policies: [default, large]}\n"
        "tenants:\n"
        "  narrow: {running: 2, per_minute: 1000, policies: [default]}\n",
    )
    with in_stack(redis_server, tmp_path, policies_dir=policies) as inproc:
        yield inproc


def test_running_quota_frees_when_an_execution_ends(limited: InStack) -> None:
    with limited.client("narrow") as http:
        first = http.post("/v1/executions", json=BODY).json()["id"]
        assert http.post("/v1/executions", json=BODY).status_code == 202
        full = http.post("/v1/executions", json=BODY)
        assert full.status_code == 429 and full.headers["retry-after"] == "1", full.text
        assert http.post(f"/v1/executions/{first}/cancel").json()["status"] == "cancelled"
        assert http.post("/v1/executions", json=BODY).status_code == 202
        # An end by the worker frees a slot as a cancel does.
        assert http.post("/v1/executions", json=BODY).status_code == 429
        ran = limited.run_all()
        assert len(ran) == 2 and all(http.get(f"/v1/executions/{e}").json()["status"] == "succeeded" for e in ran)
        assert [http.post("/v1/executions", json=BODY).status_code for _ in range(3)] == [202, 202, 429]


def test_policy_not_allowed_for_tenant_is_403(limited: InStack) -> None:
    with limited.client("narrow") as narrow, limited.client("other") as other:
        refused = narrow.post("/v1/executions", json={**BODY, "policy": {"name": "large"}})
        allowed = other.post("/v1/executions", json={**BODY, "policy": {"name": "large"}})
    assert refused.status_code == 403 and refused.json()["code"] == "request.policy_not_allowed", refused.text
    assert "policy.name" in {e["field"] for e in refused.json()["errors"]}
    assert allowed.status_code == 202, allowed.text


def test_full_queue_is_503(redis_server: Redis, tmp_path: Path) -> None:
    with in_stack(redis_server, tmp_path, queue={"max_depth": 1}) as inproc, inproc.client() as http:
        assert http.post("/v1/executions", json=BODY).status_code == 202
        full = http.post("/v1/executions", json=BODY)
    assert full.status_code == 503 and full.json()["code"] == "queue_full" and full.headers["retry-after"] == "5"
