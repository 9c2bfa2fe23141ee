"""Issue 44, item 6, from the attacker's side (control C52), in process against a real Redis: an
approval covers everything it lets run. A key that may not decide cannot compensate a gated step
or have it run again under the approval it had; an approval shows the inputs (a list too), env,
stdin, files, network and the code that runs with it (checks, compensation); an approval ends with
its run or execution; and a key whose writes need approval (the operator's policy) cannot leave
the gate out nor decide it."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import pytest
import redis

from execbox import cli
from execbox.executions.record import ExecutionRecord
from execbox.executions.settle import mark_expired_if_due
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.unit.test_plans import Harness, cell, plan, plans

pytestmark = pytest.mark.redis
__all__ = ["plans"]  # the fixture, used by name
UNDO = "import execbox\nexecbox.emit('refunded', True)  # the compensation: code no approver decided on\n"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def paid_step(by: list[str], strategy: str = "key") -> dict[str, Any]:
    """A write gated by an approval that names who decides it, with a compensation."""
    return {"id": "pay", "run": cell("print('pay 40 EUR')"), "args": {"amount": 40}, "effect": "write",
            "idempotency": {"strategy": strategy}, "approval": {"summary": "pay 40 EUR", "by": by},
            "compensation": {"run": cell(UNDO)}}  # fmt: skip


def approve(plans: Harness, approval_id: str, key: str) -> None:
    decided = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"},
                              headers=bearer(key))  # fmt: skip
    assert decided.status_code == 200, decided.text


# -- a key that may not decide can neither compensate nor retry a gated step -----------------------


def test_a_key_that_may_not_decide_cannot_compensate_a_gated_step(plans: Harness, settings: Settings) -> None:
    approver_key, approver = ApiKeys(plans.client, settings.redis.key_prefix).create("alpha")
    run = plans.start(plan(paid_step([approver.key_id])))
    approve(plans, run["steps"]["pay"]["approval_id"], approver_key)
    plans.finish(run["id"], "pay", {"paid": True})
    assert plans.run(run["id"])["status"] == "succeeded"

    compensated = plans.http.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "undo it"},
                                  headers=plans.headers)  # fmt: skip
    cancelled = plans.http.post(f"/v1/runs/{run['id']}/cancel", json={"compensate": True}, headers=plans.headers)
    after = plans.run(run["id"])

    assert compensated.status_code == 403 and compensated.json()["code"] == "approval.forbidden"
    assert "step pay's compensation" in compensated.json()["detail"], compensated.json()
    assert cancelled.status_code in (403, 409)  # the run already ended: nothing is cancelled, nothing undone
    assert after["compensation"] is None and plans.executions_of(run["id"], "pay") == after["steps"]["pay"]["attempts"]
    allowed = plans.http.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "undo it"},
                              headers=bearer(approver_key))  # fmt: skip
    assert allowed.status_code == 200 and allowed.json()["compensation"]["order"] == ["pay"], allowed.text


def test_a_key_that_may_not_decide_cannot_cancel_a_running_gated_run_with_compensate(
    plans: Harness, settings: Settings
) -> None:
    approver_key, approver = ApiKeys(plans.client, settings.redis.key_prefix).create("alpha")
    run = plans.start(plan(paid_step([approver.key_id]), {"id": "after", "run": cell(), "depends_on": ["pay"]}))
    approve(plans, run["steps"]["pay"]["approval_id"], approver_key)
    plans.finish(run["id"], "pay", {"paid": True})

    refused = plans.http.post(f"/v1/runs/{run['id']}/cancel", json={"compensate": True}, headers=plans.headers)

    assert refused.status_code == 403 and refused.json()["errors"][0]["field"] == "compensate", refused.text
    assert plans.run(run["id"])["status"] == "running", "refused before anything changed"


def test_a_reconciled_retry_of_a_gated_write_waits_for_a_new_approval(plans: Harness, settings: Settings) -> None:
    approver_key, approver = ApiKeys(plans.client, settings.redis.key_prefix).create("alpha")
    run = plans.start(plan(paid_step([approver.key_id], strategy="none")))
    first = run["steps"]["pay"]["approval_id"]
    approve(plans, first, approver_key)
    plans.finish(run["id"], "pay", category=ErrorCategory.SANDBOX_ERROR)  # lost after its code started
    assert plans.statuses(run["id"]) == {"pay": "unknown_outcome"}

    settle = {"outcome": "not_applied", "retry": True, "reason": "the bank shows nothing"}
    retried = plans.http.post(f"/v1/runs/{run['id']}/steps/pay/reconcile", json=settle, headers=plans.headers)

    state = retried.json()["steps"]["pay"]
    assert retried.status_code == 200 and state["status"] == "awaiting_approval", retried.text
    assert len(state["attempts"]) == 1, "the approved payment did not run again under its first approval"
    second = plans.http.get(f"/v1/approvals/{state['approval_id']}", headers=plans.headers).json()
    assert state["approval_id"] != first and second["status"] == "pending"
    assert "run again after a reconcile: not_applied: the bank shows nothing" in second["summary"]
    refused = plans.http.post(f"/v1/approvals/{second['id']}/decision", json={"decision": "approve"},
                              headers=plans.headers)  # fmt: skip
    assert refused.status_code == 403
    approve(plans, second["id"], approver_key)
    assert plans.statuses(run["id"]) == {"pay": "running"} and len(plans.executions_of(run["id"], "pay")) == 2


# -- an approval shows everything that runs because of it -----------------------------------------


def test_an_executions_approval_shows_list_inputs_env_stdin_files_network_and_its_status_check(
    plans: Harness,
) -> None:
    data = b"iban,amount\nDE00,40\n"
    check = {"name": "ledger", "code": "print('read the ledger')", "expect": {"type": "object"}}
    body = {"language": "python", "code": "print('pay')", "inputs": [40, "EUR"], "env": {"BANK_TOKEN": "s3cret"},
            "stdin": "confirm\n", "files": [{"path": "payees.csv", "content_b64": base64.b64encode(data).decode()}],
            "effect": "write", "idempotency": {"strategy": "status_read", "key": "pay-1", "status_check": check},
            "approval": {"summary": "pay 40 EUR"}}  # fmt: skip
    created = plans.http.post("/v1/executions", json=body, headers=plans.headers)
    assert created.status_code == 202, created.text

    shown = plans.http.get(f"/v1/approvals/{created.json()['approval_id']}", headers=plans.headers).json()

    assert shown["inputs"] == [40, "EUR"] and shown["args"] == {}, "a list of inputs is shown as it is"
    assert shown["env_sha256"] == {"BANK_TOKEN": hashlib.sha256(b"s3cret").hexdigest()}
    assert "s3cret" not in json.dumps(shown), "env values are shown as digests only"
    assert shown["stdin_bytes"] == 8 and shown["stdin_sha256"] == hashlib.sha256(b"confirm\n").hexdigest()
    (listed,) = shown["files"]
    assert (listed["path"], listed["size"], listed["sha256"]) == (
        "payees.csv",
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
    assert shown["network"] == "none" and shown["policy"] == "default" and shown["language"] == "python"
    assert shown["also_runs"] == [{"role": "status_check", "name": "ledger", "language": "python",
                                   "code": check["code"], "args": {}}]  # fmt: skip


def test_the_mcp_tool_lists_what_an_approval_shows(plans: Harness) -> None:
    body = {"language": "python", "code": "print('pay')", "inputs": [40], "env": {"TOKEN": "t"},
            "approval": {"summary": "pay"}}  # fmt: skip
    assert plans.http.post("/v1/executions", json=body, headers=plans.headers).status_code == 202
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_approvals", "arguments": {}}}
    sent = {**plans.headers, "Accept": "application/json, text/event-stream", "Host": "localhost:8000"}

    answer = plans.http.post("/mcp/", json=call, headers=sent)

    (data,) = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: ")]
    (listed,) = json.loads(json.loads(data)["result"]["content"][0]["text"])["approvals"]
    assert listed["inputs"] == [40] and listed["env_sha256"] == {"TOKEN": hashlib.sha256(b"t").hexdigest()}
    assert listed["network"] == "none" and listed["also_runs"] == [] and "files" in listed


def test_a_steps_approval_shows_its_preconditions_files_network_and_compensation(plans: Harness) -> None:
    step = paid_step([])
    step["preconditions"] = [{"name": "still_open", "run": cell("print('check')"), "expect": {"type": "object"}}]
    step["files"] = [{"path": "invoice.txt", "content_b64": base64.b64encode(b"40 EUR").decode()}]
    run = plans.start(plan(step))

    shown = plans.http.get(f"/v1/approvals/{run['steps']['pay']['approval_id']}", headers=plans.headers).json()

    assert shown["args"] == {"amount": 40} and shown["network"] == "none" and shown["policy"] == "default"
    assert shown["files"] == [{"path": "invoice.txt", "size": 6, "sha256": hashlib.sha256(b"40 EUR").hexdigest(),
                               "source": "inline"}]  # fmt: skip
    roles = {c["role"]: c["code"] for c in shown["also_runs"]}
    assert roles == {"precondition": "print('check')", "compensation": UNDO}


def test_a_script_steps_approval_shows_the_scripts_code(plans: Harness) -> None:
    script = {"name": "refund", "version": "1.0.0", "language": "python", "code": "print('refund 40 EUR')"}
    assert plans.http.post("/v1/scripts", json=script, headers=plans.headers).status_code == 201
    run = plans.start(plan({"id": "pay", "run": {"script": "refund@1.0.0"}, "approval": {"summary": "refund"}}))

    shown = plans.http.get(f"/v1/approvals/{run['steps']['pay']['approval_id']}", headers=plans.headers).json()

    assert shown["code"] == "# the script refund@1.0.0\nprint('refund 40 EUR')", "not only its name"
    assert shown["language"] == "python" and shown["network"] == "none"


# -- an approval ends with its subject -----------------------------------------------------------------


def test_the_approval_of_a_cancelled_run_is_withdrawn_and_cannot_be_approved(plans: Harness) -> None:
    run = plans.start(plan(paid_step([])))
    approval_id = run["steps"]["pay"]["approval_id"]
    assert plans.http.post(f"/v1/runs/{run['id']}/cancel", headers=plans.headers).status_code == 200

    shown = plans.http.get(f"/v1/approvals/{approval_id}", headers=plans.headers).json()
    late = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"}, headers=plans.headers)
    pending = plans.http.get("/v1/approvals?status=pending", headers=plans.headers).json()

    assert shown["status"] == "withdrawn" and "cancelled" in shown["reason"], shown
    assert late.status_code == 409 and "withdrawn" in late.json()["detail"] and "cancelled" in late.json()["detail"]
    assert pending == [] and plans.statuses(run["id"]) == {"pay": "cancelled"}


def test_the_approval_of_a_run_past_its_wall_budget_is_withdrawn(plans: Harness) -> None:
    run = plans.start(plan(paid_step([]), budgets={"max_wall_s": 1}))
    approval_id = run["steps"]["pay"]["approval_id"]
    stored = plans.executor.store.get(run["id"])
    assert stored is not None
    stored.created_at -= 5  # its wall budget passed (as the plans consumer finds it when the run falls due)
    plans.executor.store.put(stored, time.time())
    plans.executor.advance(run["id"])

    late = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"}, headers=plans.headers)

    assert plans.run(run["id"])["stop_reason"] == "budget_exceeded:wall"
    assert late.status_code == 409 and "withdrawn" in late.json()["detail"], late.text


def gated_execution(plans: Harness) -> dict[str, Any]:
    body = {"language": "python", "code": "print('pay')", "approval": {"summary": "pay"}}
    created = plans.http.post("/v1/executions", json=body, headers=plans.headers)
    assert created.status_code == 202 and created.json()["status"] == "awaiting_approval", created.text
    execution: dict[str, Any] = created.json()
    return execution


def test_the_approval_of_a_cancelled_execution_is_withdrawn(plans: Harness) -> None:
    execution = gated_execution(plans)
    assert plans.http.post(f"/v1/executions/{execution['id']}/cancel", headers=plans.headers).status_code == 200

    listed = plans.http.get("/v1/approvals", headers=plans.headers).json()
    late = plans.http.post(f"/v1/approvals/{execution['approval_id']}/decision", json={"decision": "approve"},
                           headers=plans.headers)  # fmt: skip

    assert [(a["id"], a["status"]) for a in listed] == [(execution["approval_id"], "withdrawn")]
    assert late.status_code == 409 and "withdrawn: its execution was cancelled" in late.json()["detail"]


def test_the_approval_of_an_expired_execution_is_expired(plans: Harness) -> None:
    execution = gated_execution(plans)

    def expire(record: ExecutionRecord) -> ExecutionStatus | None:
        record.queue_deadline = time.time() - 1  # as the sweeper finds it past its deadline
        return mark_expired_if_due(record)

    assert plans.store.transition(execution["id"], {ExecutionStatus.AWAITING_APPROVAL}, "test", expire) is not None

    shown = plans.http.get(f"/v1/approvals/{execution['approval_id']}", headers=plans.headers).json()
    late = plans.http.post(f"/v1/approvals/{execution['approval_id']}/decision", json={"decision": "approve"},
                           headers=plans.headers)  # fmt: skip
    assert shown["status"] == "expired"
    assert late.status_code == 409 and "expired" in late.json()["detail"]


# -- a key whose writes need approval cannot leave the gate out -----------------------------------


@pytest.fixture
def restrained(
    plans: Harness, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    """A key of tenant alpha issued by the operator's command with --require-approval."""
    monkeypatch.setenv("EXECBOX_REDIS__URL", settings.redis.url)
    monkeypatch.setenv("EXECBOX_REDIS__KEY_PREFIX", settings.redis.key_prefix)
    capsys.readouterr()
    assert cli.main(["keys", "create", "--tenant", "alpha", "--require-approval"]) == 0
    key = capsys.readouterr().out.strip()
    assert cli.main(["keys", "list"]) == 0
    assert f"{key.split('_')[1]}  alpha  active  requires-approval" in capsys.readouterr().out
    return key


def test_a_restrained_keys_write_waits_for_approval_even_resubmitted_without_one(
    plans: Harness, restrained: str
) -> None:
    write = {"language": "python", "code": "print('pay')", "effect": "write",
             "idempotency": {"strategy": "key", "key": "pay-7"}}  # fmt: skip
    asked = plans.http.post("/v1/executions", json={**write, "approval": {"summary": "pay"}},
                            headers={**bearer(restrained), "Idempotency-Key": "a"})  # fmt: skip
    left_out = plans.http.post("/v1/executions", json=write, headers={**bearer(restrained), "Idempotency-Key": "b"})
    opted_out = plans.http.post("/v1/executions", json={**write, "approval": {"required": False}},
                                headers=bearer(restrained))  # fmt: skip
    pure = plans.http.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=bearer(restrained)
    )

    for answer in (asked, left_out, opted_out):
        assert answer.status_code == 202 and answer.json()["status"] == "awaiting_approval", answer.text
    approval = plans.http.get(f"/v1/approvals/{left_out.json()['approval_id']}", headers=plans.headers).json()
    assert approval["required_by"] and "writes need approval" in approval["required_by"]
    assert pure.json()["status"] == "queued", "no side effect (no write, no network): nothing to approve"
    self_approved = plans.http.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"},
                                    headers=bearer(restrained))  # fmt: skip
    assert self_approved.status_code == 403 and "writes need approval" in self_approved.json()["detail"]
    approve(plans, approval["id"], plans.headers["Authorization"].removeprefix("Bearer "))
    assert plans.http.get(f"/v1/executions/{left_out.json()['id']}", headers=plans.headers).json()["status"] == "queued"


def test_a_restrained_keys_run_gates_its_writes_and_it_cannot_undo_or_retry_them(
    plans: Harness, restrained: str
) -> None:
    write = {"id": "pay", "run": cell(), "effect": "write", "idempotency": {"strategy": "none"},
             "compensation": {"run": cell(UNDO)}}  # fmt: skip
    created = plans.http.post("/v1/runs", json={"plan": plan({"id": "look", "run": cell()}, write)},
                              headers=bearer(restrained))  # fmt: skip
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["steps"]["pay"]["status"] == "awaiting_approval", "a write, gated though the plan asks no approval"
    assert run["steps"]["look"]["status"] == "running", "no side effect: nothing to approve"
    approval_id = run["steps"]["pay"]["approval_id"]
    refused = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"},
                              headers=bearer(restrained))  # fmt: skip
    assert refused.status_code == 403 and "writes need approval" in refused.json()["detail"]
    added = plans.http.post(f"/v1/runs/{run['id']}/revisions", headers=bearer(restrained), json={
        "base_revision": 1, "add": [{**write, "id": "again"}], "reason": "another way in"})  # fmt: skip
    assert added.json()["steps"]["again"]["status"] == "awaiting_approval", added.text
    decider = plans.headers["Authorization"].removeprefix("Bearer ")
    approve(plans, approval_id, decider)
    plans.finish(run["id"], "pay", {"paid": True})
    approve(plans, plans.run(run["id"])["steps"]["again"]["approval_id"], decider)
    plans.finish(run["id"], "again", category=ErrorCategory.SANDBOX_ERROR)  # lost after its code started

    undo = plans.http.post(f"/v1/runs/{run['id']}/compensate", json={"reason": "undo"}, headers=bearer(restrained))
    retried = plans.http.post(f"/v1/runs/{run['id']}/steps/again/reconcile", headers=bearer(restrained),
                              json={"outcome": "not_applied", "retry": True, "reason": "again"})  # fmt: skip

    assert undo.status_code == 403 and undo.json()["code"] == "approval.forbidden", undo.text
    assert retried.json()["steps"]["again"]["status"] == "awaiting_approval", retried.text
    assert len(retried.json()["steps"]["again"]["attempts"]) == 1 and retried.json()["compensation"] is None


def test_a_restrained_key_cannot_run_code_by_a_route_with_no_approval_on_the_way(
    plans: Harness, restrained: str
) -> None:
    script = {"name": "refund", "version": "1.0.0", "language": "python", "code": "print('refund')"}
    registered = plans.http.post("/v1/scripts", json=script, headers=bearer(restrained))
    invoked = plans.http.post("/v1/scripts/refund/invoke", json={"version": "1.0.0", "inputs": {}},
                              headers=bearer(restrained))  # fmt: skip
    scheduled = plans.http.post("/v1/schedules", json={"script": "refund@1.0.0", "cron": "* * * * *"},
                                headers=bearer(restrained))  # fmt: skip
    sandbox = plans.http.post("/e2b/v2/sandboxes", json={"templateID": "code-interpreter-v1"},
                              headers={"X-API-KEY": restrained})  # fmt: skip

    assert registered.status_code == 201, "registering runs nothing"
    for refused in (invoked, scheduled):
        assert refused.status_code == 403 and refused.json()["code"] == "approval.forbidden", refused.text
        assert "writes need approval" in refused.json()["detail"]
    assert sandbox.status_code == 403 and "writes need approval" in sandbox.json()["message"], "E2B's own shape"


def test_keys_stored_without_the_attribute_read_as_unrestrained(plans: Harness, settings: Settings) -> None:
    keys = ApiKeys(plans.client, settings.redis.key_prefix)
    key, info = keys.create("alpha")
    stored = plans.client.get(keys.lookup_key(f"Bearer {key}"))
    assert stored is not None and "require_approval" not in json.loads(stored), "stored as before when unset"
    restrained_key, restrained_info = keys.create("alpha", require_approval=True)
    assert keys.info(info.key_id) == info and not keys.requires_approval(info.key_id)
    assert keys.requires_approval(restrained_info.key_id)
    keys.revoke(restrained_info.key_id)
    assert keys.info(restrained_info.key_id).require_approval, "revoking keeps the attribute"  # type: ignore[union-attr]


def test_the_operator_issues_a_restrained_key_through_the_admin_api(settings: Settings, client: redis.Redis) -> None:
    from pydantic import SecretStr

    from execbox.api import create_app
    from tests.unit.conftest import InProcess

    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": SecretStr("t0ken")})})
    http = InProcess(create_app(admin))
    try:
        made = http.post("/v1/admin/keys", json={"tenant": "alpha", "require_approval": True}, headers=bearer("t0ken"))
        listed = http.get("/v1/admin/keys", headers=bearer("t0ken")).json()
    finally:
        http.close()
    assert made.status_code == 201 and made.json()["require_approval"] is True, made.text
    assert [k["require_approval"] for k in listed] == [True]
