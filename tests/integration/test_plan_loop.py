"""Plans that hold the whole loop, on the real stack: input steps (a model's turn inside the plan),
declared fallbacks, model calls kept whole with their budgets, script steps refused before anything
runs, and a scheduled script's outputs delivered on success."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Side, auth, create_key, policies_with_tenants, wait_until
from tests.integration.conftest import Hooks
from tests.integration.test_requests import queued_jobs
from tests.integration.test_scripts import logs, register

pytestmark = [pytest.mark.docker, pytest.mark.redis]

TABLES = 'import execbox\nexecbox.emit("tables", {"orders": ["id", "total"], "customers": ["id", "country"]})\n'
USE = 'import execbox\nexecbox.emit("echo", execbox.inputs["sql"])\n'
SQL_SCHEMA = {"type": "object", "required": ["sql"], "additionalProperties": False,
              "properties": {"sql": {"type": "string", "pattern": "^SELECT "}}}  # fmt: skip


def settled(api: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once it no longer runs (the server's wait, asked again while it still runs)."""
    for _ in range(6):
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
        if run["status"] != "running":
            return run
    raise AssertionError(f"run {run_id} is still running")


def input_plan(**asked: Any) -> dict[str, Any]:
    return {"format": "plan/v1", "steps": [
        {"id": "schema", "run": {"code": TABLES}},
        {"id": "query", "input": {"schema": SQL_SCHEMA, "summary": "write the SQL", **asked},
         "args": {"tables": {"$ref": "/steps/schema/outputs/tables"}}},
        {"id": "use", "run": {"code": USE}, "args": {"sql": {"$ref": "/steps/query/outputs/sql"}}},
    ]}  # fmt: skip


def test_an_input_step_refuses_a_bad_value_and_continues_on_a_good_one(api: httpx.Client) -> None:
    run = settled(api, api.post("/v1/runs", json={"plan": input_plan()}).json()["id"])
    assert run["status"] == "awaiting_input", run["events"]
    query = run["steps"]["query"]
    assert query["status"] == "awaiting_input" and query["attempts"] == []
    assert query["args"] == {"tables": {"orders": ["id", "total"], "customers": ["id", "country"]}}, "the context"
    assert query["input"]["summary"] == "write the SQL" and query["input"]["schema"] == SQL_SCHEMA
    assert run["steps"]["use"]["status"] == "pending"

    bad = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "DROP TABLE orders"}})
    assert bad.status_code == 422 and bad.json()["code"] == "input.invalid", bad.text
    assert [e["field"] for e in bad.json()["errors"]] == ["value.sql"]
    extra = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1", "x": 1}})
    assert extra.status_code == 422
    still = api.get(f"/v1/runs/{run['id']}").json()
    assert still["status"] == "awaiting_input" and still["steps"]["query"]["outputs"] is None, "nothing was kept"
    early = api.post(f"/v1/runs/{run['id']}/steps/use/input", json={"value": {"sql": "SELECT 1"}})
    assert early.status_code == 409, "a step that is not an input step takes no value"

    good = {"sql": "SELECT id FROM orders"}
    supplied = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": good, "supplied_by": "the model"})
    assert supplied.status_code == 200, supplied.text
    again = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": good})
    other = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 2"}})
    assert again.status_code == 200 and other.status_code == 409, "the same value again is a no-op; another is not"
    done = settled(api, run["id"])
    assert done["status"] == "succeeded", done["events"]
    assert done["steps"]["query"]["outputs"] == good and done["steps"]["use"]["outputs"] == {"echo": good["sql"]}
    assert done["steps"]["query"]["input"]["supplied_by"].startswith("the model (key ")
    assert done["usage"]["steps_dispatched"] == 2, "an input step dispatches nothing"


def test_an_input_step_nobody_answers_expires_and_hands_off(api: httpx.Client) -> None:
    run = settled(api, api.post("/v1/runs", json={"plan": input_plan(expires_in_s=1)}).json()["id"])
    if run["status"] == "awaiting_input":  # the executor looks again when it expires
        run = api.get(f"/v1/runs/{run['id']}", params={"wait": 30, "after": len(run["events"])}).json()
        run = settled(api, run["id"]) if run["status"] == "running" else run
    assert run["status"] == "needs_replan", run["events"]
    assert run["steps"]["query"]["error"]["category"] == "input.expired"
    assert run["steps"]["use"]["status"] == "upstream_failed"
    late = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
    assert late.status_code == 409


def test_only_the_named_keys_may_supply_an_input(api: httpx.Client, stack: Any) -> None:
    run = settled(api, api.post("/v1/runs", json={"plan": input_plan(by=["key_nobody_has"])}).json()["id"])
    refused = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
    assert refused.status_code == 403 and refused.json()["code"] == "input.forbidden"
    with httpx.Client(base_url=stack.base_url, headers=auth(stack.keys["beta"]), timeout=30) as beta:
        unseen = beta.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
    assert unseen.status_code == 404, "another tenant's run does not exist for it"
    assert api.get(f"/v1/runs/{run['id']}").json()["steps"]["query"]["status"] == "awaiting_input"
    api.post(f"/v1/runs/{run['id']}/cancel")


FEED = """
import execbox
execbox.check(execbox.inputs["source"] != "stale", "the primary feed is stale", source=execbox.inputs["source"])
execbox.emit("price", 101.5 if execbox.inputs["source"] == "primary" else 99.0)
"""


def test_a_fallback_runs_on_check_failed_and_its_outputs_are_the_steps(api: httpx.Client) -> None:
    steps = [
        {"id": "quote", "run": {"code": FEED}, "args": {"source": "stale"},
         "fallback": {"name": "backup feed", "on": ["check.failed"], "run": {"code": FEED}, "args": {"source": "b"}}},
        {"id": "total", "run": {"code": "import execbox\nexecbox.emit('total', execbox.inputs['p'] * 2)\n"},
         "args": {"p": {"$ref": "/steps/quote/outputs/price"}}},
    ]  # fmt: skip
    run = settled(api, api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}}).json()["id"])

    assert run["status"] == "succeeded", run["events"]
    quote = run["steps"]["quote"]
    assert quote["outputs"] == {"price": 99.0} and run["steps"]["total"]["outputs"] == {"total": 198.0}
    assert len(quote["attempts"]) == 2 and quote["fallback_at"] == 2
    assert quote["fallback_from"]["category"] == "check.failed"
    fell_back = [e for e in run["events"] if e["type"] == "step.fallback"]
    assert len(fell_back) == 1 and "backup feed" in fell_back[0]["detail"]
    assert run["usage"]["replans"] == 0, "the foreseen failure cost no re-plan"

    twice = [{**steps[0], "fallback": {**steps[0]["fallback"], "args": {"source": "stale"}}}]  # type: ignore[dict-item]
    failed = settled(api, api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": twice}}).json()["id"])
    assert failed["status"] == "needs_replan" and len(failed["steps"]["quote"]["attempts"]) == 2, "it runs once"
    handoff = api.get(f"/v1/runs/{failed['id']}/handoff").json()
    assert handoff["failed"][0]["fallback_from"]["category"] == "check.failed"


WRITE = """
import execbox
execbox.emit("written", True)
execbox.check(False, "the receipt did not parse")
"""


def test_a_fallback_never_runs_for_a_write_that_may_have_applied(api: httpx.Client) -> None:
    backup = {"on": ["check.failed", "precondition.failed"], "run": {"code": "import execbox\nexecbox.emit('b', 1)\n"}}
    write = {"id": "pay", "run": {"code": WRITE}, "effect": "write", "idempotency": {"strategy": "none"},
             "fallback": backup}  # fmt: skip
    run = settled(api, api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [write]}}).json()["id"])
    pay = run["steps"]["pay"]
    assert run["status"] == "needs_replan" and pay["error"]["category"] == "check.failed"
    assert len(pay["attempts"]) == 1 and pay["fallback_from"] is None, "the fallback did not run"
    assert pay["side_effects"] == "possible"
    assert not [e for e in run["events"] if e["type"] == "step.fallback"]

    closed = {"name": "open", "run": {"code": "import execbox\nexecbox.emit('open', False)\n"},
              "expect": {"properties": {"open": {"const": True}}}}  # fmt: skip
    guarded = {**write, "id": "pay2", "preconditions": [closed]}
    run = settled(api, api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [guarded]}}).json()["id"])
    pay2 = run["steps"]["pay2"]
    assert run["status"] == "succeeded", "its code never started: nothing applied, so the fallback may run"
    assert pay2["fallback_from"]["category"] == "precondition.failed" and pay2["outputs"] == {"b": 1}


def test_a_token_budget_stops_a_run_with_its_reason(api: httpx.Client) -> None:
    plan = {**input_plan(), "budgets": {"max_tokens": 1000}}
    run = settled(api, api.post("/v1/runs", json={"plan": plan}).json()["id"])
    assert run["status"] == "awaiting_input"
    planner = {"model": "m-1", "role": "planner", "input_tokens": 500, "output_tokens": 200, "cost_usd": 0.01,
               "latency_ms": 900, "call_id": "c1"}  # fmt: skip
    first = api.post(f"/v1/runs/{run['id']}/usage", json=planner).json()
    repeated = api.post(f"/v1/runs/{run['id']}/usage", json=planner).json()
    assert first["usage"]["tokens"] == repeated["usage"]["tokens"] == 700, "a call_id is counted once"
    bad = api.post(f"/v1/runs/{run['id']}/usage", json={**planner, "role": "Planner!", "call_id": "c9"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "role"
    supplier = {"model": "m-1", "role": "supplier", "input_tokens": 250, "output_tokens": 60, "call_id": "c2"}
    over = api.post(f"/v1/runs/{run['id']}/usage", json=supplier).json()

    assert over["status"] == "failed" and over["stop_reason"] == "budget_exceeded:tokens"
    assert over["steps"]["query"]["status"] == "cancelled" and over["steps"]["use"]["status"] == "cancelled"
    usage = over["usage"]
    assert (usage["tokens"], usage["input_tokens"], usage["output_tokens"], usage["model_calls"]) == (1010, 750, 260, 2)
    assert usage["by_role"]["planner"] == {"calls": 1, "input_tokens": 500, "output_tokens": 200, "cost_usd": 0.01,
                                           "latency_ms": 900.0}  # fmt: skip
    assert usage["by_role"]["supplier"]["calls"] == 1 and usage["by_role"]["supplier"]["output_tokens"] == 60
    assert [(c["role"], c["call_id"]) for c in over["model_calls"]] == [("planner", "c1"), ("supplier", "c2")]
    reported = [e for e in over["events"] if e["type"] == "usage.reported"]
    assert [e["status"] for e in reported] == ["planner", "supplier"] and "500 in, 200 out" in reported[0]["detail"]
    stopped = next(e for e in over["events"] if e["type"] == "run.status_changed" and e["status"] == "failed")
    assert "1010" in stopped["detail"] and "1000" in stopped["detail"]


@pytest.fixture
def narrow(side_stack: Callable[..., Side], tmp_path: Path) -> tuple[Side, str]:
    """A side API whose tenant `onlydefault` may use only the default policy (no worker listens)."""
    policies = policies_with_tenants(
        tmp_path,
        "default: {running: 100, per_minute: 1000, policies: [default, large]}\n"
        "tenants:\n  onlydefault: {running: 100, per_minute: 1000, policies: [default]}\n",
    )
    side = side_stack(EXECBOX_POLICIES_DIR=str(policies))
    return side, create_key(side.env, "onlydefault")  # a name no other test's quotas use (one Redis)


def test_a_script_steps_policy_and_literal_arguments_are_refused_at_validation_with_nothing_run(
    narrow: tuple[Side, str],
) -> None:
    side, key = narrow
    name = f"reports.narrow_{secrets.token_hex(3)}"
    with httpx.Client(base_url=side.base_url, headers=auth(key), timeout=30) as http:
        register(http, name)
        first = {"id": "first", "run": {"code": "print('would run first')"}}
        script = {"id": "report", "run": {"script": f"{name}@1.0.0"}, "args": {"logs": []}, "depends_on": ["first"]}
        larger = {**script, "policy": {"name": "large"}}
        wrong = {**script, "args": {"logs": "not a list"}}
        refusals = {}
        for label, step in (("policy", larger), ("args", wrong)):
            answer = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [first, step]}})
            refusals[label] = (answer.status_code, [e["field"] for e in answer.json()["errors"]])
        queued = queued_jobs(side)
        runs = http.get("/v1/runs").json()
        accepted = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [first, script]}})
        queued_after = queued_jobs(side)
        http.post(f"/v1/runs/{accepted.json()['id']}/cancel")  # frees the tenant's running slot

    assert refusals == {"policy": (422, ["plan.steps.1.policy.name"]), "args": (422, ["plan.steps.1.args.logs"])}
    assert queued == 0 and runs == [], "nothing was queued and nothing was kept"
    assert accepted.status_code == 201 and accepted.json()["steps"]["first"]["attempts"], "the same plan, allowed"
    assert queued_after == 1, "its first step was queued: the count could have moved"


def test_a_scheduled_success_delivers_its_outputs_to_a_webhook_receiver(api: httpx.Client, hooks: Hooks) -> None:
    name = f"reports.quiet_{secrets.token_hex(3)}"
    register(api, name)
    plain = {"a.log": "INFO start\nERRO disk\n", "b.log": "WARN hot\n"}
    secret = "quiet-week-secret-0123456"
    hook = {"url": hooks.url, "secret": secret}
    schedule = api.post("/v1/schedules", json={
        "script": f"{name}@1.0.0", "cron": "* * * * * */2", "inputs": {"logs": list(plain)},
        "files": logs(api, plain), "notify": "all", "webhook": hook}).json()  # fmt: skip

    def succeeded() -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b in hooks.calls if h.get("Execbox-Event") == "script.succeeded"]

    delivered: Any = wait_until(succeeded, 60, "a quiet firing's report at the webhook")
    headers, body = delivered[0]
    api.post(f"/v1/schedules/{schedule['id']}/pause")
    stamp, digest = (part.split("=", 1)[1] for part in headers["Execbox-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(digest, expected), "signed with the schedule's secret"
    event = json.loads(body)["event"]
    assert event["type"] == "script.succeeded" and event["schedule"] == schedule["id"]
    assert event["outputs"] == {"errors": 1} and event["error"] is None
    assert event["artifacts"] == [f"/v1/executions/{event['execution_id']}/artifacts/report.md"]
    report = api.get(event["artifacts"][0])
    assert report.status_code == 200 and "a.log: 1" in report.text
    assert secret not in body.decode(), "the secret never travels"
