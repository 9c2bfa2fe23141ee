"""Side effects in plans through the API, its plan consumer and the worker's real code on the fake
sandbox (the in-process stack): keys that survive a re-plan, unknown outcomes said from inside a
step, undeclared steps with network access never retried blindly, compensations. What a write sends
is the key each run of its program is handed, read from the fake's runs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.sandbox.fake import Script
from tests.conftest import Redis
from tests.unit.stack import InStack, in_stack
from tests.unit.test_effects_in_process import NET, SEEN, UNSURE, net_policies, sent_key, unsure

pytestmark = pytest.mark.redis
REFUND = "refund()"
LOSES_RECEIPT = "refund_then_misread_the_receipt()"
PAY, UNDO = "pay()", "undo()"


class InTurn(dict[str, Script]):
    """Scripts by code where a code's runs do different things: its n-th run does its n-th Script
    (the last one again after). The fake looks programs up with `get`."""

    def __init__(self, turns: dict[str, list[Script]]) -> None:
        super().__init__()
        self.turns = turns

    def get(self, code: str, default: Any = None) -> Any:
        if code not in self.turns:
            return default
        scripts = self.turns[code]
        return scripts.pop(0) if len(scripts) > 1 else scripts[0]


@pytest.fixture
def netstack(redis_server: Redis, tmp_path: Path) -> Iterator[InStack]:
    """The stack with the `net` policy, its worker thread running each step as it is dispatched."""
    with in_stack(redis_server, tmp_path, policies_dir=net_policies(tmp_path)) as made, made.working():
        yield made


def keys_sent(inproc: InStack, *codes: str) -> list[str | None]:
    """The key each run of one of `codes` was handed, in order."""
    programs = {code.encode() for code in codes}
    return [sent_key(s) for s in inproc.fake.runs if s.files and s.files[0][1] in programs]


def start(client: httpx.Client, steps: list[dict[str, Any]]) -> dict[str, Any]:
    created = client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}})
    assert created.status_code == 201, created.text
    return settled(client, created.json()["id"])


def settled(client: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once it stops moving (neither running nor being compensated)."""
    run: dict[str, Any] = client.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
    assert run["status"] != "running" and (run["compensation"] or {}).get("status") != "running", run
    return run


def refund_step(step_id: str, order: str, code: str = REFUND, **args: Any) -> dict[str, Any]:
    return {"id": step_id, "run": {"code": code}, "args": {"order": order, **args}, "policy": NET,
            "effect": "write", "idempotency": {"strategy": "key", "key": "refund:{args.order}"}}  # fmt: skip


def test_a_write_re_added_by_a_revision_reaches_the_ledger_with_the_first_key_and_is_applied_once(
    netstack: InStack,
) -> None:
    order = f"o-{secrets.token_hex(4)}"
    receipt = {"message": "the receipt did not parse", "details": {}}
    netstack.fake.scripts[LOSES_RECEIPT] = Script(outputs={"applied": True}, check=receipt, exit_code=1)
    netstack.fake.scripts[REFUND] = Script(outputs={"applied": False})  # the ledger knew the key
    with netstack.client() as client:
        run = start(client, [refund_step("refund", order, LOSES_RECEIPT)])
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
    assert run["steps"]["refund2"]["outputs"] == {"applied": False}
    assert keys_sent(netstack, LOSES_RECEIPT) + keys_sent(netstack, REFUND) == [f"refund:{order}"] * 2, (
        "one key for both writes: applied once"
    )


def test_a_key_template_naming_no_argument_is_refused(inproc: InStack) -> None:
    step = {"id": "w", "run": {"code": "1"}, "args": {"order": "o-1"}, "effect": "write",
            "idempotency": {"strategy": "key", "key": "refund:{args.customer}"}}  # fmt: skip
    with inproc.client() as api:
        response = api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [step]}})
    assert response.status_code == 422 and "plan.steps.0.idempotency.key" in response.text
    assert "no argument 'customer'" in response.text
    assert inproc.run_all() == [], "nothing was dispatched"


@pytest.mark.parametrize("write_first", [True, False], ids=["applied", "not-applied"])
def test_a_step_that_says_its_outcome_is_unknown_gets_its_status_read(netstack: InStack, write_first: bool) -> None:
    order = f"o-{secrets.token_hex(4)}"
    check = {"name": "ledger", "run": {"code": SEEN}, "expect": {"properties": {"applied": {"const": True}}}}
    idempotency = {"strategy": "status_read", "key": "refund:{args.order}", "status_check": check}
    step = {"id": "refund", "run": {"code": UNSURE}, "args": {"write_first": write_first, "order": order},
            "policy": NET, "effect": "write", "retry": {"max_attempts": 3, "interval_s": 0},
            "idempotency": idempotency}  # fmt: skip
    # The code cannot tell; the check sees the write (it left) or not; when not, the next run writes.
    netstack.fake.scripts = InTurn({
        UNSURE: [unsure("the ledger timed out"), Script(outputs={"applied": True})],
        SEEN: [Script(outputs={"applied": write_first})],
    })  # fmt: skip
    with netstack.client() as client:
        run = start(client, [step])
    state = run["steps"]["refund"]
    assert run["status"] == "succeeded", run
    assert state["outputs"] == {"applied": True} and len(state["checks"]) == 1
    if write_first:  # the status read saw the write: succeeded without a second attempt
        assert len(state["attempts"]) == 1 and keys_sent(netstack, UNSURE) == [f"refund:{order}"]
    else:  # it saw none: the step ran again with its key
        assert len(state["attempts"]) == 2 and keys_sent(netstack, UNSURE) == [f"refund:{order}"] * 2
    assert keys_sent(netstack, SEEN) == [f"refund:{order}"], "the check reads the same key"


@pytest.mark.parametrize("network", [True, False], ids=["with-network", "offline"])
def test_an_undeclared_step_is_retried_in_place_only_without_network(netstack: InStack, network: bool) -> None:
    code = "send()"
    netstack.fake.scripts[code] = unsure("the provider timed out")
    step = {"id": "send", "run": {"code": code}, "retry": {"max_attempts": 3, "interval_s": 0},
            **({"policy": NET} if network else {})}  # fmt: skip
    with netstack.client() as client:
        run = start(client, [step])
    state = run["steps"]["send"]
    if network:  # it could have reached the world: one attempt, and its outcome waits for reconcile
        assert state["status"] == "unknown_outcome" and len(state["attempts"]) == 1, state
        assert state["side_effects"] == "unknown"
    else:  # it could not: safe to run again
        assert state["status"] == "failed" and len(state["attempts"]) == 3, state
        assert state["side_effects"] == "none"
    assert len(keys_sent(netstack, code)) == len(state["attempts"])


def pay_step(step_id: str, after: list[str], **args: Any) -> dict[str, Any]:
    undo_args = {"paid": {"$ref": f"/steps/{step_id}/outputs/applied"}}
    return {"id": step_id, "run": {"code": PAY}, "args": args, "depends_on": after, "policy": NET,
            "effect": "write", "idempotency": {"strategy": "key"},
            "compensation": {"run": {"code": UNDO}, "args": undo_args}}  # fmt: skip


def undo_inputs(inproc: InStack, execution_id: str) -> Any:
    record = inproc.worker.store.get(execution_id)
    assert record is not None
    return record.inputs


def test_a_cancel_with_compensate_undoes_the_writes_that_succeeded_and_says_what_it_could_not(
    netstack: InStack,
) -> None:
    netstack.fake.scripts[PAY] = Script(outputs={"applied": True})
    netstack.fake.scripts[UNDO] = Script(outputs={"undone": True})
    no_undo = {"id": "mail", "run": {"code": "print('sent')"}, "effect": "write", "idempotency": {"strategy": "none"},
               "depends_on": ["pay1"]}  # fmt: skip
    gate = {"id": "ship", "run": {"code": "print(1)"}, "depends_on": ["mail"], "approval": {"summary": "ship it?"}}
    with netstack.client() as client:
        run = start(client, [pay_step("pay1", []), no_undo, gate])
        assert run["status"] == "awaiting_approval", run
        cancelled = client.post(f"/v1/runs/{run['id']}/cancel", json={"compensate": True, "reason": "not needed"})
        assert cancelled.status_code == 200, cancelled.text
        done = settled(client, run["id"])
        again = client.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "twice"})
    undo = done["steps"]["pay1"]["undo"]
    assert done["status"] == "cancelled" and done["compensation"]["status"] == "completed", undo
    assert undo["status"] == "done"
    assert done["steps"]["mail"]["undo"] == {"status": "skipped", "execution": None,
                                             "reason": "no compensation declared: its effect stays"}  # fmt: skip
    assert undo_inputs(netstack, undo["execution"]) == {"paid": True}, "the step's own output, by reference"
    assert keys_sent(netstack, UNDO) == [f"{run['id']}:pay1:undo"]
    assert again.status_code == 409


def test_a_compensation_that_fails_stops_and_is_not_retried(netstack: InStack) -> None:
    down = "refund_api_down()"
    netstack.fake.scripts[PAY] = Script(outputs={"applied": True})
    netstack.fake.scripts[UNDO] = Script(outputs={"undone": True})
    netstack.fake.scripts[down] = Script(
        stderr="Traceback (most recent call last):\nRuntimeError: the refund API is down\n", exit_code=1
    )
    broken = pay_step("charge1", [])
    broken["compensation"]["run"]["code"] = down
    with netstack.client() as client:
        run = start(client, [broken, pay_step("charge2", ["charge1"])])
        assert run["status"] == "succeeded", run
        client.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "refund everything"})
        done = settled(client, run["id"])
    assert done["compensation"]["status"] == "stopped"
    assert done["steps"]["charge2"]["undo"]["status"] == "done"
    undo = done["steps"]["charge1"]["undo"]
    assert undo["status"] == "failed" and "the refund API is down" in undo["reason"]
    assert len(done["steps"]["charge1"]["checks"]) == 1, "one attempt, never retried blindly"
    undos = [f"{run['id']}:charge2:undo", f"{run['id']}:charge1:undo"]
    assert keys_sent(netstack, UNDO, down) == undos, "each undo once, in reverse dependency order"
