"""Side effects of single executions through the API and the worker's real code, on the fake sandbox
(the in-process stack): approvals decided through the API, a worker lost mid-write settled by the
reaper, unknown outcomes said from inside, declarations refused. No ledger runs here: what a write
sends is the key each run of its program is handed, read from the fake's runs (a service that
applies a key once applies these runs once)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from execbox.sandbox.fake import Script
from execbox.sandbox.runtime import SandboxSpec
from execbox.worker.reaper import sweep
from tests.conftest import Redis, policies_with_tenants, wait_until
from tests.unit.stack import NOTHING, InStack, in_stack

pytestmark = pytest.mark.redis
NET = {"name": "net", "timeout_s": 30, "network": {"mode": "allowlist", "allow": ["target-ledger:8080"]}}
WRITE = "refund()"
"""A write to the ledger behind the allowlist (what it does is the Script the test registers)."""
UNSURE = "refund_unsure()"
SEEN = "seen()"
OUTCOME_UNKNOWN = 1
"""The exit code of execbox.outcome_unknown (it raises OutcomeUnknown, a SystemExit)."""


def unsure(reason: str) -> Script:
    """A program that says it cannot tell whether its effect happened (execbox.outcome_unknown)."""
    return Script(check={"message": reason, "details": {}, "outcome_unknown": True}, exit_code=OUTCOME_UNKNOWN)


def net_policies(tmp_path: Path, declare_effects: bool = False) -> Path:
    """The repository's policies plus `net` (the ledger's host allowed), offered to every tenant."""
    default = {"running": 64, "per_minute": 600, "policies": ["default", "large", "net"],
               "declare_effects": declare_effects}  # fmt: skip
    policies = policies_with_tenants(tmp_path, yaml.safe_dump({"default": default, "tenants": {}}))
    (policies / "net.yaml").write_text(yaml.safe_dump({"network_allow": ["target-ledger:8080"]}))
    return policies


@pytest.fixture
def netstack(redis_server: Redis, tmp_path: Path) -> Iterator[InStack]:
    with in_stack(redis_server, tmp_path, policies_dir=net_policies(tmp_path)) as made:
        yield made


def key() -> str:
    return f"refund-{secrets.token_hex(6)}"


def sent_key(spec: SandboxSpec) -> str | None:
    return dict(spec.env).get("EXECBOX_IDEMPOTENCY_KEY")


def runs_of(inproc: InStack, execution_id: str) -> list[tuple[str, str | None]]:
    """Each run the fake gave the execution: its program (the code, or its status check's) and the key
    it was handed."""
    return [(s.files[0][1].decode(), sent_key(s)) for s in inproc.fake.runs if s.execution_id == execution_id]


def write(api: Any, strategy: str, **fields: Any) -> dict[str, Any]:
    idempotency: dict[str, Any] = {"strategy": strategy, **fields.pop("idempotency", {})}
    body = {"language": "python", "code": WRITE, "policy": NET, "effect": "write", "idempotency": idempotency,
            **fields}  # fmt: skip
    response = api.post("/v1/executions", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


def lose_the_worker_mid_write(inproc: InStack, monkeypatch: pytest.MonkeyPatch, execution_id: str) -> int:
    """The write starts on the worker (its run is in the fake's runs: the request has left), then the
    worker is lost: it stops renewing the run's lease, which lapses, and the reaper's sweep (another
    worker's) settles the attempt; the lost worker's late result comes after and changes nothing.
    The executions the sweep found lost."""
    held = threading.Event()
    inproc.fake.scripts[WRITE] = Script(outputs={"applied": True}, hold=held)  # the answer that never arrives
    monkeypatch.setattr(inproc.worker.store, "renew_lease", lambda *_: None)
    lost = threading.Thread(target=inproc.run_one, name="lost-worker", daemon=True)
    lost.start()
    try:
        wait_until(lambda: runs_of(inproc, execution_id), 10, "the write to start")
        store = inproc.worker.store
        inproc.redis.delete(store.keys.lease(execution_id))  # no renewal for longer than the lease

        def began_a_lease_ago(record: Any) -> None:
            record.started_at -= inproc.settings.worker.lease_s + 1

        store.update(execution_id, began_a_lease_ago)
        found = sweep(inproc.worker)["lost"]
    finally:
        held.set()
        lost.join(10)
    assert not lost.is_alive()
    return found


def test_an_unkeyed_write_whose_worker_dies_ends_unknown_and_reconcile_settles_it(
    netstack: InStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = key()
    with netstack.client() as client:
        execution_id = write(client, "none", idempotency={"key": token})["id"]
        assert lose_the_worker_mid_write(netstack, monkeypatch, execution_id) == 1
        assert netstack.run_all() == [], "nothing runs it again"
        done = client.get(f"/v1/executions/{execution_id}").json()
        assert done["status"] == "unknown_outcome" and done["side_effects"] == "unknown", done
        assert done["code_runs"] == 1 and done["error"]["details"]["reason"] == "worker_lost"
        assert done["outputs"] == {}, "the lost worker's late result is not taken"
        early = client.post(f"/v1/executions/{execution_id}/reconcile", json={"outcome": "applied"})
        assert early.status_code == 422 and "reason" in early.text
        settled = client.post(
            f"/v1/executions/{execution_id}/reconcile",
            json={"outcome": "applied", "outputs": {"applied": True}, "reason": "the ledger shows the key"},
        )
        assert settled.status_code == 200, settled.text
        assert settled.json()["status"] == "succeeded" and settled.json()["outputs"] == {"applied": True}
        assert settled.json()["reconciled"] == "applied: the ledger shows the key"
        again = client.post(f"/v1/executions/{execution_id}/reconcile", json={"outcome": "applied", "reason": "x"})
        assert again.status_code == 409
    assert runs_of(netstack, execution_id) == [(WRITE, token)], "never sent twice"


def test_a_keyed_write_whose_worker_is_lost_runs_again_in_place_with_its_key(
    netstack: InStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestration of tests/integration/test_effects.py's end-to-end kill test (a real worker
    SIGKILLed, the real ledger applying the key once)."""
    refund = key()
    with netstack.client() as client:
        execution_id = write(client, "key", idempotency={"key": refund})["id"]
        assert lose_the_worker_mid_write(netstack, monkeypatch, execution_id) == 1
        queued = client.get(f"/v1/executions/{execution_id}").json()
        assert queued["status"] == "queued" and queued["code_runs"] == 1, queued
        netstack.fake.scripts[WRITE] = Script(outputs={"applied": False})  # the ledger knew the key
        assert netstack.run_all() == [execution_id]
        done = client.get(f"/v1/executions/{execution_id}").json()
    assert done["status"] == "succeeded" and done["code_runs"] == 2, done
    assert done["outputs"] == {"applied": False}, "the second run's, not the lost worker's late one"
    assert runs_of(netstack, execution_id) == [(WRITE, refund), (WRITE, refund)], "the same key twice"


def test_an_execution_needing_approval_runs_only_once_approved_and_a_rejected_one_never(netstack: InStack) -> None:
    approved_key, rejected_key = key(), key()
    netstack.fake.scripts[WRITE] = Script(outputs={"applied": True})
    with netstack.client() as client:
        gated = {"approval": {"summary": "refund 20 EUR"}}
        waiting = write(client, "key", idempotency={"key": approved_key}, **gated)
        refused = write(client, "key", idempotency={"key": rejected_key}, **gated)
        for execution in (waiting, refused):
            assert execution["status"] == "awaiting_approval" and execution["approval_id"], execution
        listed = {a["id"]: a for a in client.get("/v1/approvals", params={"status": "pending"}).json()}
        approval = listed[waiting["approval_id"]]
        assert approval["execution_id"] == waiting["id"] and approval["run_id"] is None
        assert approval["code"] == WRITE and approval["summary"] == "refund 20 EUR"
        # Nothing runs it while it waits: a worker finds nothing to start.
        assert netstack.run_all() == []
        still = client.get(f"/v1/executions/{waiting['id']}").json()
        assert still["status"] == "awaiting_approval" and still["started_at"] is None
        decided = client.post(f"/v1/approvals/{refused['approval_id']}/decision",
                              json={"decision": "reject", "reason": "not this one"})  # fmt: skip
        assert decided.status_code == 200 and decided.json()["status"] == "rejected"
        decided = client.post(f"/v1/approvals/{waiting['approval_id']}/decision", json={"decision": "approve"})
        assert decided.status_code == 200 and decided.json()["status"] == "approved"
        assert netstack.run_all() == [waiting["id"]]
        done = client.get(f"/v1/executions/{waiting['id']}").json()
        rejected = client.get(f"/v1/executions/{refused['id']}").json()
        twice = client.post(f"/v1/approvals/{refused['approval_id']}/decision", json={"decision": "approve"})
    assert done["status"] == "succeeded" and done["outputs"] == {"applied": True}
    assert rejected["status"] == "failed" and rejected["error"]["category"] == "approval.rejected"
    assert rejected["error"]["message"] == "not this one" and rejected["started_at"] is None
    assert rejected["side_effects"] == "none" and rejected["code_runs"] == 0
    assert twice.status_code == 409, "a rejected execution cannot be approved after"
    assert netstack.run_all() == []
    assert runs_of(netstack, waiting["id"]) == [(WRITE, approved_key)] and runs_of(netstack, refused["id"]) == []


@pytest.mark.parametrize("write_first", [True, False], ids=["applied", "not-applied"])
def test_code_that_says_its_outcome_is_unknown_gets_its_status_read(netstack: InStack, write_first: bool) -> None:
    refund = key()
    check = {"name": "ledger", "code": SEEN, "expect": {"properties": {"applied": {"const": True}}}}
    idempotency = {"strategy": "status_read", "key": refund, "status_check": check}
    body = {"language": "python", "code": UNSURE, "policy": NET, "effect": "write", "idempotency": idempotency}
    netstack.fake.scripts[UNSURE] = unsure("the ledger timed out")
    netstack.fake.scripts[SEEN] = Script(outputs={"applied": write_first})
    with netstack.client() as client:
        execution_id = client.post("/v1/executions", json=body).json()["id"]
        assert netstack.run_one() == execution_id  # the code: it cannot tell
        checking = client.get(f"/v1/executions/{execution_id}").json()
        assert checking["status"] == "queued" and checking["phase"] == "status_read", checking
        assert netstack.run_one() == execution_id  # its status check
        if not write_first:  # the check saw none: the code runs again, and writes this time
            netstack.fake.scripts[UNSURE] = Script(outputs={"applied": True})
            assert netstack.run_one() == execution_id
        assert netstack.run_one() == NOTHING
        done = client.get(f"/v1/executions/{execution_id}").json()
    assert done["status"] == "succeeded", done["error"]
    assert done["outputs"] == {"applied": True}
    if write_first:  # the check saw the write: no second run
        assert done["code_runs"] == 1 and done["reconciled"].startswith("ledger: the effect happened")
        assert runs_of(netstack, execution_id) == [(UNSURE, refund), (SEEN, refund)]
    else:  # the check saw none: run again, with the same key
        assert done["code_runs"] == 2
        assert runs_of(netstack, execution_id) == [(UNSURE, refund), (SEEN, refund), (UNSURE, refund)]


def test_an_unkeyed_write_that_says_its_outcome_is_unknown_is_not_run_again(netstack: InStack) -> None:
    refund = key()
    netstack.fake.scripts[UNSURE] = unsure("the ledger timed out after the request left")
    body = {"language": "python", "code": UNSURE, "policy": NET, "effect": "write",
            "idempotency": {"strategy": "none", "key": refund}}  # fmt: skip
    with netstack.client() as client:
        execution_id = client.post("/v1/executions", json=body).json()["id"]
        assert netstack.run_all() == [execution_id]
        done = client.get(f"/v1/executions/{execution_id}").json()
    assert done["status"] == "unknown_outcome" and done["error"]["category"] == "outcome.unknown", done
    assert done["error"]["details"]["reason"] == "the ledger timed out after the request left"
    assert done["code_runs"] == 1 and runs_of(netstack, execution_id) == [(UNSURE, refund)]


def test_each_call_is_handed_its_own_key_in_a_fresh_sandbox_and_in_a_session(inproc: InStack) -> None:
    """The worker's half of the key reaching the code: each run's environment carries its call's key
    (the declared one, else the request's Idempotency-Key). The languages' own readings of it
    (execbox.idempotency_key(), idempotencyKey(), $EXECBOX_IDEMPOTENCY_KEY, in a session's contexts
    too) are the sandbox's: tests/integration/test_effects.py runs them."""
    with inproc.hosting_sessions(), inproc.client() as api, inproc.working():
        opened = api.post("/v1/sessions", json={"language": "python"})
        assert opened.status_code == 201, opened.text
        session = opened.json()["id"]
        for where in ({}, {"session": session}):
            for declared, header in ((key(), None), (None, key())):
                body: dict[str, Any] = {"language": "python", "code": "print(1)", "effect": "read", **where}
                if declared:
                    body = {**body, "effect": "write", "idempotency": {"strategy": "key", "key": declared}}
                headers = {"Idempotency-Key": header} if header else {}
                done = api.post("/v1/executions", json=body, headers=headers, params={"wait": 10}).json()
                assert done["status"] == "succeeded", done
                (spec,) = [s for s in inproc.fake.runs if s.execution_id == done["id"]]
                assert sent_key(spec) == (declared or header), (where, spec.env)
    assert len(inproc.fake.sessions[session].calls) == 2


BAD_DECLARATIONS: list[tuple[dict[str, Any], str]] = [
    ({"effect": "write"}, "idempotency"),
    ({"effect": "read", "idempotency": {"strategy": "none"}}, "idempotency"),
    ({"effect": "write", "idempotency": {"strategy": "key"}}, "idempotency.key"),
    ({"effect": "write", "idempotency": {"strategy": "key", "key": "has space"}}, "key"),
    ({"effect": "write", "idempotency": {"strategy": "status_read"}}, "status_check"),
    ({"effect": "write", "idempotency": {"strategy": "compensation"}}, "strategy"),
    ({"effect": "delete"}, "effect"),
    ({"approval": {"expires_in_s": 0}}, "expires_in_s"),
    (
        {
            "effect": "write",
            "idempotency": {
                "strategy": "status_read",
                "status_check": {"code": "1", "language": "cobol", "expect": {}},
            },
        },
        "idempotency.status_check.language",
    ),
]


def test_a_bad_effect_declaration_is_refused_naming_its_field_and_stores_nothing(inproc: InStack) -> None:
    """Each declaration of BAD_DECLARATIONS in turn, on one stack (a stack each costs more than the request)."""
    with inproc.client() as api:
        before = api.get("/v1/approvals").json()
        for fields, field in BAD_DECLARATIONS:
            response = api.post("/v1/executions", json={"language": "python", "code": "print(1)", **fields})
            assert response.status_code == 422, (fields, response.text)
            assert field in response.text, (fields, response.text)
        assert api.get("/v1/approvals").json() == before
    assert inproc.run_all() == [], "nothing was queued"


def test_a_tenant_that_requires_declarations_refuses_an_undeclared_execution_with_network(
    redis_server: Redis, tmp_path: Path
) -> None:
    policies = net_policies(tmp_path, declare_effects=True)
    with in_stack(redis_server, tmp_path, policies_dir=policies) as inproc, inproc.client() as client:
        undeclared = client.post("/v1/executions", json={"language": "python", "code": "1", "policy": NET})
        declared = client.post("/v1/executions", json={"language": "python", "code": "1", "policy": NET,
                                                       "effect": "read"})  # fmt: skip
        offline = client.post("/v1/executions", json={"language": "python", "code": "1"})
    assert undeclared.status_code == 422 and '"effect"' in undeclared.text, undeclared.text
    assert declared.status_code == 202 and offline.status_code == 202
