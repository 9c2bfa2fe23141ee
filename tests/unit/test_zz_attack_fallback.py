from __future__ import annotations

from typing import Any

import pytest

from execbox.executions.status import ErrorCategory
from tests.unit.test_plans import Harness, cell, plan
from tests.unit.test_plans import plans as plans  # the fixture

pytestmark = pytest.mark.redis
BACKUP = "print('fallback: a different write')"


def test_fallback_after_keyed_write_started_then_precondition_fails(plans: Harness) -> None:
    step = {"id": "w", "run": cell("print('charge card')"), "effect": "write", "idempotency": {"strategy": "key"},
            "retry": {"interval_s": 0},
            "preconditions": [{"name": "open", "run": cell(), "expect": {"required": ["ok"]}}],
            "fallback": {"on": ["precondition.failed"], "run": cell(BACKUP)}}
    run = plans.start(plan(step))
    rid = run["id"]
    plans.finish(rid, "w", {"ok": True})  # precondition holds
    print(plans.run(rid)["steps"]["w"]["status"], plans.run(rid)["steps"]["w"]["attempts"])
    plans.finish(rid, "w", category=ErrorCategory.SANDBOX_ERROR, started=True)  # the write started, worker died
    plans.executor.advance(rid)
    s = plans.run(rid)["steps"]["w"]
    print("after attempt 1:", s["status"], s["phase"], s["side_effects"])
    plans.finish(rid, "w", {})  # precondition now does not hold (the charge went through?)
    s = plans.run(rid)["steps"]["w"]
    print("after precondition:", s["status"], s["fallback_from"], s["side_effects"], len(s["attempts"]))
    last = plans.store.get(s["attempts"][-1])
    print("last attempt's code:", last.code if last else None)
    assert last is not None and last.code == BACKUP, "fallback ran after a write whose code started"


def test_fallback_after_keyed_write_started_then_last_attempt_expired(plans: Harness) -> None:
    step = {"id": "w", "run": cell("print('charge card')"), "effect": "write", "idempotency": {"strategy": "key"},
            "retry": {"interval_s": 0},
            "fallback": {"on": ["expired"], "run": cell(BACKUP)}}
    run = plans.start(plan(step))
    rid = run["id"]
    plans.finish(rid, "w", category=ErrorCategory.SANDBOX_ERROR, started=True)
    plans.executor.advance(rid)
    plans.finish(rid, "w", category=ErrorCategory.SANDBOX_ERROR, started=True)
    plans.executor.advance(rid)
    plans.finish(rid, "w", category=ErrorCategory.EXPIRED, started=False)
    s = plans.run(rid)["steps"]["w"]
    print("status:", s["status"], "side_effects:", s["side_effects"], "fallback_from:", s["fallback_from"])
    last = plans.store.get(s["attempts"][-1])
    assert last is not None and last.code == BACKUP, "fallback ran after two started attempts of a write"


def test_fallback_runs_code_nobody_approved(plans: Harness) -> None:
    step = {"id": "w", "run": cell("print('approved code')"), "approval": {"summary": "ok?"},
            "fallback": {"on": ["code.exception"], "run": cell("print('never shown to the approver')")}}
    run = plans.start(plan(step))
    rid = run["id"]
    s = plans.run(rid)["steps"]["w"]
    approval = plans.http.get(f"/v1/approvals/{s['approval_id']}", headers=plans.headers).json()
    print("approver sees code:", approval["code"])
    d = plans.http.post(f"/v1/approvals/{s['approval_id']}/decision", json={"decision": "approve"},
                        headers=plans.headers)
    assert d.status_code == 200, d.text
    plans.executor.advance(rid)
    plans.finish(rid, "w", category=ErrorCategory.CODE_EXCEPTION)
    s = plans.run(rid)["steps"]["w"]
    last = plans.store.get(s["attempts"][-1])
    print("ran:", last.code if last else None, s["status"])
    assert last is not None and "never shown" in last.code


def test_fallback_attempt_keys(plans: Harness) -> None:
    step = {"id": "a", "run": cell(), "fallback": {"on": ["code.exception"], "run": cell("print(2)")}}
    run = plans.start(plan(step))
    rid = run["id"]
    plans.finish(rid, "a", category=ErrorCategory.CODE_EXCEPTION)
    s = plans.run(rid)["steps"]["a"]
    ids = s["attempts"]
    print("attempts", ids, len(set(ids)), s["error"], s["side_effects"], s["status"])
    assert len(set(ids)) == 2
    # fallback fails too: no second fallback
    plans.finish(rid, "a", category=ErrorCategory.CODE_EXCEPTION)
    s = plans.run(rid)["steps"]["a"]
    print(s["status"], len(s["attempts"]))
    assert s["status"] == "failed"


def test_fallback_on_script_with_disallowed_policy(plans: Harness) -> None:
    step = {"id": "a", "run": cell(), "fallback": {"on": ["code.exception"], "run": cell("print(2)"),
                                                   "policy": {"name": "networked"}}}
    answer = plans.http.post("/v1/plans/validate", json=plan(step), headers=plans.headers)
    print("fallback policy networked:", answer.status_code, answer.text[:300])
