"""Side effects in plans on the real stack: keys that survive a re-plan, unknown outcomes said from
inside a step, and undeclared steps with network access never retried blindly (the ledger behind
the egress allowlist)."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from tests.conftest import Side
from tests.integration.conftest import Targets
from tests.integration.test_effects import NET, SEEN, UNSURE, entries

pytestmark = [pytest.mark.docker, pytest.mark.redis]

REFUND = """
import execbox, json, urllib.request
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": execbox.idempotency_key()})
applied = json.loads(urllib.request.urlopen(request, timeout=10).read())["applied"]
execbox.emit("applied", applied)
"""
LOSES_RECEIPT = REFUND.replace("execbox.emit(", 'execbox.check(False, "the receipt did not parse")\nexecbox.emit(')


def settled(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once it stops moving (a long poll on the server at a time)."""
    for _ in range(6):
        run: dict[str, Any] = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
        if run["status"] not in ("running",):
            return run
    raise AssertionError(f"run {run_id} is still running")


def refund_step(step_id: str, order: str, code: str = REFUND, **args: Any) -> dict[str, Any]:
    return {"id": step_id, "run": {"code": code}, "args": {"order": order, **args}, "policy": NET,
            "effect": "write", "idempotency": {"strategy": "key", "key": "refund:{args.order}"}}  # fmt: skip


def test_a_write_re_added_by_a_revision_reaches_the_ledger_with_the_first_key_and_is_applied_once(
    netside: Side, targets: Targets
) -> None:
    order = f"o-{secrets.token_hex(4)}"
    plan = {"format": "plan/v1", "steps": [refund_step("refund", order, LOSES_RECEIPT)]}
    with netside.client() as client:
        run = settled(client, client.post("/v1/runs", json={"plan": plan}).json()["id"])
        assert run["status"] == "needs_replan" and run["steps"]["refund"]["key"] == f"refund:{order}", run
        assert run["steps"]["refund"]["side_effects"] == "possible"
        other = {"base_revision": 1, "add": [refund_step("refund_other", order, amount=5)]}
        refused = client.post(f"/v1/runs/{run['id']}/revisions", json=other)
        assert refused.status_code == 422 and "revision.steps.1.idempotency.key" in refused.text, refused.text
        again = {"base_revision": 1, "reason": "the receipt parser is fixed", "add": [refund_step("refund2", order)]}
        revised = client.post(f"/v1/runs/{run['id']}/revisions", json=again)
        assert revised.status_code == 200, revised.text
        run = settled(client, run["id"])
    assert run["status"] == "succeeded", run
    assert run["steps"]["refund2"]["key"] == f"refund:{order}"
    assert run["steps"]["refund2"]["outputs"] == {"applied": False}, "the ledger knew the key"
    assert entries(targets, f"refund:{order}") == [True, False], "one key, applied once"


def test_a_key_template_naming_no_argument_is_refused(api: httpx.Client) -> None:
    step = {"id": "w", "run": {"code": "1"}, "args": {"order": "o-1"}, "effect": "write",
            "idempotency": {"strategy": "key", "key": "refund:{args.customer}"}}  # fmt: skip
    response = api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [step]}})
    assert response.status_code == 422 and "plan.steps.0.idempotency.key" in response.text
    assert "no argument 'customer'" in response.text


@pytest.mark.parametrize("write_first", [True, False], ids=["applied", "not-applied"])
def test_a_step_that_says_its_outcome_is_unknown_gets_its_status_read(
    netside: Side, targets: Targets, write_first: bool
) -> None:
    order = f"o-{secrets.token_hex(4)}"
    check = {"name": "ledger", "run": {"code": SEEN}, "expect": {"properties": {"applied": {"const": True}}}}
    idempotency = {"strategy": "status_read", "key": "refund:{args.order}", "status_check": check}
    step = {"id": "refund", "run": {"code": UNSURE}, "args": {"write_first": write_first, "order": order},
            "policy": NET, "effect": "write", "retry": {"max_attempts": 3, "interval_s": 0},
            "idempotency": idempotency}  # fmt: skip
    with netside.client() as client:
        run = settled(
            client, client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [step]}}).json()["id"]
        )
    state = run["steps"]["refund"]
    assert run["status"] == "succeeded", run
    assert entries(targets, f"refund:{order}") == [True], "written once"
    if write_first:  # the status read saw the write: succeeded without a second attempt
        assert len(state["attempts"]) == 1 and state["outputs"] == {"applied": True}
    else:  # it saw none: the step ran again with its key
        assert len(state["attempts"]) == 2 and state["outputs"] == {"applied": True}


@pytest.mark.parametrize("network", [True, False], ids=["with-network", "offline"])
def test_an_undeclared_step_is_retried_in_place_only_without_network(netside: Side, network: bool) -> None:
    code = "import execbox\nexecbox.outcome_unknown('the provider timed out')"
    step = {"id": "send", "run": {"code": code}, "retry": {"max_attempts": 3, "interval_s": 0},
            **({"policy": NET} if network else {})}  # fmt: skip
    with netside.client() as client:
        run = settled(
            client, client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [step]}}).json()["id"]
        )
    state = run["steps"]["send"]
    if network:  # it could have reached the world: one attempt, and its outcome waits for reconcile
        assert state["status"] == "unknown_outcome" and len(state["attempts"]) == 1, state
        assert state["side_effects"] == "unknown"
    else:  # it could not: safe to run again
        assert state["status"] == "failed" and len(state["attempts"]) == 3, state
        assert state["side_effects"] == "none"
