"""Side effects in plans on the real stack, end to end: real programs writing to the ledger behind the
egress allowlist, a failed plan compensated in reverse order while a real compensation's worker is
SIGKILLed. The orchestration of plan effects (keys across a re-plan, unknown outcomes said from
inside a step, undeclared steps with network access, cancels with compensate, a failing
compensation) runs in process: tests/unit/test_plan_effects.py."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from tests.conftest import Side, wait_until
from tests.integration.conftest import Targets
from tests.integration.test_effects import NET, entries

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def settled(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once it stops moving (a long poll on the server at a time)."""
    for _ in range(6):
        run: dict[str, Any] = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
        if run["status"] not in ("running",):
            return run
    raise AssertionError(f"run {run_id} is still running")


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
