from __future__ import annotations

import time
from typing import Any

import pytest

from execbox.executions.status import ErrorCategory
from execbox.plans.schemas import StoredRun
from execbox.tenancy.apikeys import ApiKeys
from tests.unit.test_plans import Harness, cell, plan
from tests.unit.test_plans import plans as plans  # the fixture

pytestmark = pytest.mark.redis
SQL = {"type": "object", "required": ["sql"], "properties": {"sql": {"type": "string"}}}


def supply(plans: Harness, run_id: str, step: str, value: Any, headers: dict[str, str] | None = None) -> Any:
    return plans.http.post(f"/v1/runs/{run_id}/steps/{step}/input", json={"value": value, "supplied_by": "t"},
                           headers=headers or plans.headers)


def test_other_tenant_cannot_supply(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL}}))
    assert run["status"] == "awaiting_input", run
    beta = {"Authorization": plans.http.app.state and plans.headers["Authorization"]}
    from tests.unit.test_plans import Api  # noqa
    keys = ApiKeys(plans.client, "")
    answer = supply(plans, run["id"], "q", {"sql": "x"}, headers=None)
    assert answer.status_code == 200, answer.text


def test_forbidden_key_removes_input_step_via_revision(plans: Harness, settings: Any) -> None:
    keys = ApiKeys(plans.client, settings.redis.key_prefix)
    allowed_key, allowed = keys.create("alpha")
    other_key, _ = keys.create("alpha")
    other = {"Authorization": f"Bearer {other_key}"}
    run = plans.start(plan(
        {"id": "q", "input": {"schema": SQL, "by": [allowed.key_id]}},
        {"id": "use", "run": cell(), "args": {"sql": {"$ref": "/steps/q/outputs/sql"}}},
    ))
    assert supply(plans, run["id"], "q", {"sql": "drop table x"}, other).status_code == 403
    r = plans.http.post(f"/v1/runs/{run['id']}/revisions", headers=other, json={
        "base_revision": 1, "reason": "bypass", "remove": ["q", "use"],
        "add": [{"id": "use2", "run": cell(), "args": {"sql": "drop table x"}}]})
    print("revision by a key not in `by`:", r.status_code, r.json().get("status"))
    assert r.status_code == 200
    after = plans.run(run["id"])
    print({k: v["status"] for k, v in after["steps"].items()})
    assert after["steps"]["use2"]["status"] == "running"


def test_same_value_equality_is_python_equality(plans: Harness) -> None:
    schema = {"type": "object", "properties": {"ok": {}}}
    run = plans.start(plan({"id": "q", "input": {"schema": schema}}, {"id": "b", "run": cell(), "depends_on": ["q"]}))
    assert supply(plans, run["id"], "q", {"ok": True}).status_code == 200
    second = supply(plans, run["id"], "q", {"ok": 1})
    print("different value {ok:1} after {ok:true}:", second.status_code)
    third = supply(plans, run["id"], "q", {"ok": 1.0})
    print("different value {ok:1.0}:", third.status_code)
    assert second.status_code == 200  # docs promise 409 for another value


def test_supply_after_expiry_and_removed(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL, "expires_in_s": 1}}))
    time.sleep(1.1)
    answer = supply(plans, run["id"], "q", {"sql": "x"})
    print("after expiry:", answer.status_code, answer.json().get("detail"))
    plans.executor.advance(run["id"])
    after = plans.run(run["id"])
    print(after["status"], after["steps"]["q"]["status"], after["steps"]["q"]["error"])
    assert after["status"] == "needs_replan"


def test_stored_record_reads_back_with_input(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL, "summary": "s", "by": []}}))
    raw = plans.client.get(plans.executor.store.keys.run(run["id"]))
    print(raw[:0])
    stored = StoredRun.model_validate_json(raw)
    assert stored.steps["q"].input is not None
    print("public input:", run["steps"]["q"]["input"])


def test_usage_call_id_dedupe_past_1000(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL}}))
    rid = run["id"]
    from execbox.plans import usage
    from execbox.plans.usage import ModelCallReport
    # fill the list directly to save time
    with plans.executor.store.locked(rid):
        stored = plans.executor.store.get(rid)
        for i in range(usage.MAX_LISTED_CALLS):
            usage.record(stored.usage, stored.model_calls, ModelCallReport(call_id=f"c{i}", input_tokens=1), 1.0)
        plans.executor.save(stored)
    body = {"role": "planner", "input_tokens": 100, "call_id": "retry-me"}
    for _ in range(3):
        a = plans.http.post(f"/v1/runs/{rid}/usage", json=body, headers=plans.headers)
        assert a.status_code == 200, a.text
    u = plans.run(rid)["usage"]
    print("tokens after 3 reports of the same call_id past 1000:", u["tokens"], u["by_role"]["planner"])
    assert u["by_role"]["planner"]["calls"] == 3


def test_usage_events_unbounded(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL}}))
    rid = run["id"]
    for i in range(300):
        a = plans.http.post(f"/v1/runs/{rid}/usage", json={"role": f"r{i}", "input_tokens": 1}, headers=plans.headers)
        assert a.status_code == 200
    r = plans.run(rid)
    print("events:", len(r["events"]), "roles:", len(r["usage"]["by_role"]),
          "record bytes:", len(plans.client.get(plans.executor.store.keys.run(rid))))


def test_usage_on_finished_run(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": SQL}}))
    rid = run["id"]
    plans.http.post(f"/v1/runs/{rid}/cancel", json={}, headers=plans.headers)
    a = plans.http.post(f"/v1/runs/{rid}/usage", json={"role": "x", "input_tokens": 1}, headers=plans.headers)
    print("usage on cancelled run:", a.status_code)


def test_redos_in_schema_pattern(plans: Harness) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    run = plans.start(plan({"id": "q", "input": {"schema": schema}}))
    t = time.monotonic()
    answer = supply(plans, run["id"], "q", {"s": "a" * 24 + "!"})
    took = time.monotonic() - t
    print("ReDoS supply:", answer.status_code, f"{took:.1f}s for 25 chars")
