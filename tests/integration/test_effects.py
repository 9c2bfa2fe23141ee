"""Side effects of single executions on the real stack: the ledger behind the egress allowlist, real
workers SIGKILLed mid-write, approvals decided through the API, unknown outcomes said from inside."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import Side, wait_until
from tests.integration.conftest import Targets

pytestmark = [pytest.mark.docker, pytest.mark.redis]

NET = {"name": "net", "timeout_s": 30, "network": {"mode": "allowlist", "allow": ["target-ledger:8080"]}}
WRITE = """
import execbox, json, time, urllib.request
key = execbox.inputs.get("key") or execbox.idempotency_key()
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": key})
answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
if answer["applied"] and execbox.inputs.get("hold"):
    time.sleep(120)  # the first write holds here: the test kills this worker
execbox.emit("applied", answer["applied"])
"""
SEEN = """
import execbox, json, urllib.request
key = execbox.idempotency_key()
answer = json.loads(urllib.request.urlopen(f"http://target-ledger:8080/seen?key={key}", timeout=10).read())
execbox.emit("applied", answer["seen"])
"""
UNSURE = """
import execbox, json, urllib.request
def post(key):
    request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                     headers={"Idempotency-Key": key})
    return json.loads(urllib.request.urlopen(request, timeout=10).read())["applied"]
key = execbox.idempotency_key()
if execbox.inputs["write_first"]:
    post(key)  # the write left, and then the answer was lost
    execbox.outcome_unknown("the ledger timed out after the request left")
if post("tried-" + key):  # the first run gives up before writing; the second writes
    raise execbox.OutcomeUnknown("the ledger timed out before the request left")
execbox.emit("applied", post(key))
"""


def key() -> str:
    return f"refund-{secrets.token_hex(6)}"


def entries(targets: Targets, for_key: str) -> list[bool]:
    return [e["applied"] for e in targets.ledger() if e["key"] == for_key]


def finished(client: httpx.Client, execution_id: str, within_s: float = 180) -> dict[str, Any]:
    """The execution once it stops (waiting on the server, a long poll at a time)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found: dict[str, Any] = client.get(f"/v1/executions/{execution_id}", params={"wait": 30}).json()
        if found["status"] not in ("queued", "running", "awaiting_approval"):
            return found
    raise AssertionError(f"execution {execution_id} did not end within {within_s} s")


def write(client: httpx.Client, strategy: str, inputs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    idempotency: dict[str, Any] = {"strategy": strategy, **fields.pop("idempotency", {})}
    body = {"language": "python", "code": WRITE, "policy": NET, "inputs": inputs, "effect": "write",
            "idempotency": idempotency, **fields}  # fmt: skip
    response = client.post("/v1/executions", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


def kill_mid_write(side: Side, targets: Targets, ledger_key: str, create: Any) -> str:
    """Start the write on a worker of its own, wait for the ledger to see it, start a second worker
    (its reaper settles the first's attempt) and SIGKILL the first; the execution's id."""
    first = side.worker(f"fx-{ledger_key}-1")
    execution_id: str = create()["id"]
    wait_until(lambda: entries(targets, ledger_key), 60, "the write to reach the ledger")
    side.worker(f"fx-{ledger_key}-2")
    os.killpg(first.pid, signal.SIGKILL)
    return execution_id


def test_a_keyed_write_whose_worker_dies_runs_again_with_its_key_and_is_applied_once(
    ledger_side: Side, targets: Targets
) -> None:
    refund = key()
    with ledger_side.client() as client:
        create = lambda: write(client, "key", {"hold": True}, idempotency={"key": refund})  # noqa: E731
        done = finished(client, kill_mid_write(ledger_side, targets, refund, create))
    assert done["status"] == "succeeded", done["error"]["message"]
    assert done["code_runs"] == 2 and done["outputs"] == {"applied": False}
    assert entries(targets, refund) == [True, False], "the same key twice: applied once"


def test_an_unkeyed_write_whose_worker_dies_ends_unknown_and_reconcile_settles_it(
    ledger_side: Side, targets: Targets
) -> None:
    token = key()
    with ledger_side.client() as client:
        create = lambda: write(client, "none", {"hold": True, "key": token})  # noqa: E731
        execution_id = kill_mid_write(ledger_side, targets, token, create)
        done = finished(client, execution_id)
        assert done["status"] == "unknown_outcome" and done["side_effects"] == "unknown", done
        assert done["code_runs"] == 1 and done["error"]["details"]["reason"] == "worker_lost"
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
    assert entries(targets, token) == [True], "never sent twice"


def test_an_execution_needing_approval_runs_only_once_approved_and_a_rejected_one_never(
    netside: Side, targets: Targets
) -> None:
    approved_key, rejected_key = key(), key()
    with netside.client() as client:
        gated = {"approval": {"summary": "refund 20 EUR"}}
        waiting = write(client, "key", {}, idempotency={"key": approved_key}, **gated)
        refused = write(client, "key", {}, idempotency={"key": rejected_key}, **gated)
        for execution in (waiting, refused):
            assert execution["status"] == "awaiting_approval" and execution["approval_id"], execution
        listed = {a["id"]: a for a in client.get("/v1/approvals", params={"status": "pending"}).json()}
        approval = listed[waiting["approval_id"]]
        assert approval["execution_id"] == waiting["id"] and approval["run_id"] is None
        assert approval["code"] == WRITE and approval["summary"] == "refund 20 EUR"
        # Nothing runs it while it waits: with two idle workers, it is still waiting a full wait later.
        still = client.get(f"/v1/executions/{waiting['id']}", params={"wait": 2}).json()
        assert still["status"] == "awaiting_approval" and still["started_at"] is None
        decided = client.post(f"/v1/approvals/{refused['approval_id']}/decision",
                              json={"decision": "reject", "reason": "not this one"})  # fmt: skip
        assert decided.status_code == 200 and decided.json()["status"] == "rejected"
        decided = client.post(f"/v1/approvals/{waiting['approval_id']}/decision", json={"decision": "approve"})
        assert decided.status_code == 200 and decided.json()["status"] == "approved"
        done, rejected = finished(client, waiting["id"]), finished(client, refused["id"])
        twice = client.post(f"/v1/approvals/{refused['approval_id']}/decision", json={"decision": "approve"})
    assert done["status"] == "succeeded" and done["outputs"] == {"applied": True}
    assert rejected["status"] == "failed" and rejected["error"]["category"] == "approval.rejected"
    assert rejected["error"]["message"] == "not this one" and rejected["started_at"] is None
    assert rejected["side_effects"] == "none" and rejected["code_runs"] == 0
    assert twice.status_code == 409, "a rejected execution cannot be approved after"
    assert entries(targets, approved_key) == [True] and entries(targets, rejected_key) == []


@pytest.mark.parametrize("write_first", [True, False], ids=["applied", "not-applied"])
def test_code_that_says_its_outcome_is_unknown_gets_its_status_read(
    netside: Side, targets: Targets, write_first: bool
) -> None:
    refund = key()
    check = {"name": "ledger", "code": SEEN, "expect": {"properties": {"applied": {"const": True}}}}
    idempotency = {"strategy": "status_read", "key": refund, "status_check": check}
    body = {"language": "python", "code": UNSURE, "policy": NET, "inputs": {"write_first": write_first},
            "effect": "write", "idempotency": idempotency}  # fmt: skip
    with netside.client() as client:
        done = finished(client, client.post("/v1/executions", json=body).json()["id"])
    assert done["status"] == "succeeded", done["error"]["message"]
    assert done["outputs"] == {"applied": True}
    if write_first:  # the check saw the write: no second run
        assert done["code_runs"] == 1 and done["reconciled"].startswith("ledger: the effect happened")
        assert entries(targets, refund) == [True]
    else:  # the check saw none: run again, with the same key
        assert done["code_runs"] == 2 and entries(targets, refund) == [True]
        assert entries(targets, f"tried-{refund}") == [True, False]


def test_an_unkeyed_write_that_says_its_outcome_is_unknown_is_not_run_again(netside: Side, targets: Targets) -> None:
    refund = key()
    code = UNSURE.replace('execbox.inputs["write_first"]', "True")
    body = {"language": "python", "code": code, "policy": NET, "effect": "write",
            "idempotency": {"strategy": "none", "key": refund}}  # fmt: skip
    with netside.client() as client:
        done = finished(client, client.post("/v1/executions", json=body).json()["id"])
    assert done["status"] == "unknown_outcome" and done["error"]["category"] == "outcome.unknown", done
    assert done["error"]["details"]["reason"] == "the ledger timed out after the request left"
    assert done["code_runs"] == 1 and entries(targets, refund) == [True]


KEY_READERS = {
    "python": ("python", None, "import execbox\nprint(execbox.idempotency_key())"),
    "javascript": ("javascript", None, "console.log(require('execbox').idempotencyKey())"),
    "bash": ("bash", None, 'echo "$EXECBOX_IDEMPOTENCY_KEY"'),
    "session-python": ("python", "python", "import execbox\nprint(execbox.idempotency_key())"),
    "session-javascript": ("python", "javascript", "console.log(require('execbox').idempotencyKey())"),
    "session-bash": ("python", "bash", 'echo "$EXECBOX_IDEMPOTENCY_KEY"'),
}


@pytest.mark.parametrize("reader", list(KEY_READERS))
def test_the_idempotency_key_reaches_the_code_in_every_language_and_session_context(
    api: httpx.Client, reader: str
) -> None:
    language, context, code = KEY_READERS[reader]
    session = None
    if context is not None:
        session = api.post("/v1/sessions", json={"language": language}).json()["id"]
    try:
        seen = []
        for declared, header in ((key(), None), (None, key())):
            body: dict[str, Any] = {"language": language, "code": code, "effect": "read"}
            if declared:
                body = {**body, "effect": "write", "idempotency": {"strategy": "key", "key": declared}}
            if session:
                body = {**body, "session": session, "session_context": context}
            headers = {"Idempotency-Key": header} if header else {}
            done = api.post("/v1/executions", json=body, headers=headers, params={"wait": 60}).json()
            assert done["status"] == "succeeded", (done["error"], done["stderr"], done["stdout"])
            seen.append((done["stdout"].strip(), declared or header))
        assert [got for got, _ in seen] == [wanted for _, wanted in seen], "each call sees its own key"
    finally:
        if session:
            api.delete(f"/v1/sessions/{session}")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
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
    ],
)
def test_a_bad_effect_declaration_is_refused_naming_its_field_and_stores_nothing(
    api: httpx.Client, fields: dict[str, Any], field: str
) -> None:
    before = api.get("/v1/approvals").json()
    response = api.post("/v1/executions", json={"language": "python", "code": "print(1)", **fields})
    assert response.status_code == 422, response.text
    assert field in response.text
    assert api.get("/v1/approvals").json() == before


def test_a_tenant_that_requires_declarations_refuses_an_undeclared_execution_with_network(
    netside: Side, side_stack: Callable[..., Side], tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(netside.env["EXECBOX_POLICIES_DIR"], policies)
    tenants = yaml.safe_load((policies / "tenants.yaml").read_text())
    tenants["default"]["declare_effects"] = True
    (policies / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    side = side_stack(EXECBOX_POLICIES_DIR=str(policies))
    with side.client() as client:
        undeclared = client.post("/v1/executions", json={"language": "python", "code": "1", "policy": NET})
        declared = client.post("/v1/executions", json={"language": "python", "code": "1", "policy": NET,
                                                       "effect": "read"})  # fmt: skip
        offline = client.post("/v1/executions", json={"language": "python", "code": "1"})
    assert undeclared.status_code == 422 and '"effect"' in undeclared.text, undeclared.text
    assert declared.status_code == 202 and offline.status_code == 202
