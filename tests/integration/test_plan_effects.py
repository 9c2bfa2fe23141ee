"""Side effects in plans on the real stack: keys that survive a re-plan, unknown outcomes said from
inside a step, and undeclared steps with network access never retried blindly (the ledger behind
the egress allowlist)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from typing import Any

import httpx
import pytest

from tests.conftest import Side, wait_until
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


PAY = """
import execbox, json, urllib.request
if execbox.inputs.get("refused"):
    raise RuntimeError("the provider refused the payment")
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": execbox.idempotency_key()})
execbox.emit("applied", json.loads(urllib.request.urlopen(request, timeout=10).read())["applied"])
"""
UNDO = """
import execbox, json, time, urllib.request
assert execbox.inputs["paid"] is True  # the step's own output, by reference
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": execbox.idempotency_key()})
applied = json.loads(urllib.request.urlopen(request, timeout=10).read())["applied"]
if applied and execbox.inputs.get("hold"):
    time.sleep(120)  # the test kills this compensation's worker here, after the undo reached the ledger
execbox.emit("undone", applied)
"""


def pay_step(step_id: str, after: list[str], **args: Any) -> dict[str, Any]:
    undo_args = {"paid": {"$ref": f"/steps/{step_id}/outputs/applied"}, "hold": step_id == "pay2"}
    return {"id": step_id, "run": {"code": PAY}, "args": args, "depends_on": after, "policy": NET,
            "effect": "write", "idempotency": {"strategy": "key"},
            "compensation": {"run": {"code": UNDO}, "args": undo_args}}  # fmt: skip


def test_a_failed_plan_is_compensated_in_reverse_order_once_even_when_a_compensation_s_worker_dies(
    ledger_side: Side, targets: Targets
) -> None:
    steps = [pay_step("pay1", []), pay_step("pay2", ["pay1"]), pay_step("pay3", ["pay2"], refused=True)]
    first = ledger_side.worker("undo-1")
    with ledger_side.client() as client:
        run = settled(
            client, client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}}).json()["id"]
        )
        assert run["status"] == "needs_replan" and run["steps"]["pay3"]["status"] == "failed", run
        keys = {s: f"{run['id']}:{s}" for s in ("pay1", "pay2")}
        assert all(entries(targets, k) == [True] for k in keys.values())
        started = client.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "the order was abandoned"})
        assert started.status_code == 200, started.text
        assert started.json()["compensation"]["order"] == ["pay2", "pay1"]
        wait_until(lambda: entries(targets, f"{keys['pay2']}:undo"), 60, "pay2's undo to reach the ledger")
        ledger_side.worker("undo-2")
        os.killpg(first.pid, signal.SIGKILL)
        done = compensated(client, run["id"])
    assert done["compensation"]["status"] == "completed", done["compensation"]
    assert done["status"] == "cancelled" and done["stop_reason"] == "abandoned"
    assert [done["steps"][s]["undo"]["status"] for s in ("pay1", "pay2")] == ["done", "done"]
    undos = [e["key"] for e in targets.ledger() if e["key"].endswith(":undo") and e["key"].split(":")[0] == run["id"]]
    assert undos[0] == f"{keys['pay2']}:undo" and undos[-1] == f"{keys['pay1']}:undo", "reverse dependency order"
    assert entries(targets, f"{keys['pay2']}:undo") == [True, False], "run again with its key after the kill"
    assert entries(targets, f"{keys['pay1']}:undo") == [True]
    assert entries(targets, f"{run['id']}:pay3") == [], "the failed write never reached the ledger"


def compensated(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once its compensation stops running (its events wake the long poll)."""
    deadline = time.monotonic() + 180
    run: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    while run["compensation"]["status"] == "running" and time.monotonic() < deadline:
        run = client.get(f"/v1/runs/{run_id}", params={"wait": 30, "after": len(run["events"])}).json()
    return run


def test_a_cancel_with_compensate_undoes_the_writes_that_succeeded_and_says_what_it_could_not(
    netside: Side, targets: Targets
) -> None:
    no_undo = {"id": "mail", "run": {"code": "print('sent')"}, "effect": "write", "idempotency": {"strategy": "none"},
               "depends_on": ["pay1"]}  # fmt: skip
    gate = {"id": "ship", "run": {"code": "print(1)"}, "depends_on": ["mail"], "approval": {"summary": "ship it?"}}
    plan = {"format": "plan/v1", "steps": [pay_step("pay1", []), no_undo, gate]}
    with netside.client() as client:
        run = settled(client, client.post("/v1/runs", json={"plan": plan}).json()["id"])
        assert run["status"] == "awaiting_approval", run
        cancelled = client.post(f"/v1/runs/{run['id']}/cancel", json={"compensate": True, "reason": "not needed"})
        assert cancelled.status_code == 200, cancelled.text
        done = compensated(client, run["id"])
        again = client.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "twice"})
    assert done["status"] == "cancelled" and done["compensation"]["status"] == "completed", done["steps"]["pay1"][
        "undo"
    ]
    assert done["steps"]["pay1"]["undo"]["status"] == "done"
    assert done["steps"]["mail"]["undo"] == {"status": "skipped", "execution": None,
                                             "reason": "no compensation declared: its effect stays"}  # fmt: skip
    assert entries(targets, f"{run['id']}:pay1:undo") == [True]
    assert again.status_code == 409


def test_a_compensation_that_fails_stops_and_is_not_retried(netside: Side, targets: Targets) -> None:
    broken = pay_step("charge1", [])
    broken["compensation"]["run"]["code"] = "raise RuntimeError('the refund API is down')"
    second = pay_step("charge2", ["charge1"])
    plan = {"format": "plan/v1", "steps": [broken, second]}
    with netside.client() as client:
        run = settled(client, client.post("/v1/runs", json={"plan": plan}).json()["id"])
        assert run["status"] == "succeeded", run
        client.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "refund everything"})
        done = compensated(client, run["id"])
    assert done["compensation"]["status"] == "stopped"
    assert done["steps"]["charge2"]["undo"]["status"] == "done"
    undo = done["steps"]["charge1"]["undo"]
    assert undo["status"] == "failed" and "the refund API is down" in undo["reason"]
    assert len(done["steps"]["charge1"]["checks"]) == 1, "one attempt, never retried blindly"
