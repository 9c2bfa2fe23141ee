"""Plans that hold the whole loop, on the in-process stack (tests/unit/stack.py): input steps (a
model's turn inside the plan), declared fallbacks, model calls kept whole with their budgets, script
steps refused before anything runs, and a scheduled script's outputs delivered on success. The
API's plan consumer and scheduler advance everything; the worker's real code runs each execution on
the fake sandbox, each program played by a function of what it was given (test_plans_in_process)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.sandbox.fake import Script
from tests.conftest import Redis, policies_with_tenants, wait_until
from tests.unit.stack import InStack, in_stack
from tests.unit.test_plans_in_process import Given, Receiver, checked, emits, programs, signed_by, start
from tests.unit.test_plans_in_process import hooked as hooked  # the fixture

pytestmark = pytest.mark.redis

TABLES = {"orders": ["id", "total"], "customers": ["id", "country"]}
SQL_SCHEMA = {"type": "object", "required": ["sql"], "additionalProperties": False,
              "properties": {"sql": {"type": "string", "pattern": "^SELECT "}}}  # fmt: skip


def settled(api: httpx.Client, run_id: str) -> dict[str, Any]:
    """The run once it no longer runs (the server's wait, asked again while it still runs)."""
    for _ in range(3):
        run: dict[str, Any] = api.get(f"/v1/runs/{run_id}", params={"wait": 20}).json()
        if run["status"] != "running":
            return run
    raise AssertionError(f"run {run_id} is still running")


def input_plan(**asked: Any) -> dict[str, Any]:
    return {"format": "plan/v1", "steps": [
        {"id": "schema", "run": {"code": "tables()"}},
        {"id": "query", "input": {"schema": SQL_SCHEMA, "summary": "write the SQL", **asked},
         "args": {"tables": {"$ref": "/steps/schema/outputs/tables"}}},
        {"id": "use", "run": {"code": "use(sql)"}, "args": {"sql": {"$ref": "/steps/query/outputs/sql"}}},
    ]}  # fmt: skip


@pytest.fixture
def asking(inproc: InStack, monkeypatch: pytest.MonkeyPatch) -> InStack:
    """The stack with the input plan's programs: the schema step's tables, and a step that echoes the SQL."""
    programs(inproc, monkeypatch, {"tables()": lambda given: emits(tables=TABLES),
                                   "use(sql)": lambda given: emits(echo=given.inputs["sql"])})  # fmt: skip
    return inproc


def test_an_input_step_refuses_a_bad_value_and_continues_on_a_good_one(asking: InStack) -> None:
    with asking.client() as api, asking.working():
        run = settled(api, start(api, input_plan()))
        assert run["status"] == "awaiting_input", run["events"]
        query = run["steps"]["query"]
        assert query["status"] == "awaiting_input" and query["attempts"] == []
        assert query["args"] == {"tables": TABLES}, "the context"
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
    assert len(asking.fake.runs) == 2, "and nothing ran for it"


def test_an_input_step_nobody_answers_expires_and_hands_off(asking: InStack) -> None:
    with asking.client() as api, asking.working():
        run = settled(api, start(api, input_plan(expires_in_s=1)))
        if run["status"] == "awaiting_input":  # the executor looks again when it expires
            run = api.get(f"/v1/runs/{run['id']}", params={"wait": 20, "after": len(run["events"])}).json()
            run = settled(api, run["id"]) if run["status"] == "running" else run
        late = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
    assert run["status"] == "needs_replan", run["events"]
    assert run["steps"]["query"]["error"]["category"] == "input.expired"
    assert run["steps"]["use"]["status"] == "upstream_failed"
    assert late.status_code == 409


def test_only_the_named_keys_may_supply_an_input(asking: InStack) -> None:
    with asking.client() as api, asking.client("beta") as beta, asking.working():
        run = settled(api, start(api, input_plan(by=["key_nobody_has"])))
        refused = api.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
        unseen = beta.post(f"/v1/runs/{run['id']}/steps/query/input", json={"value": {"sql": "SELECT 1"}})
        after = api.get(f"/v1/runs/{run['id']}").json()
    assert refused.status_code == 403 and refused.json()["code"] == "input.forbidden"
    assert unseen.status_code == 404, "another tenant's run does not exist for it"
    assert after["steps"]["query"]["status"] == "awaiting_input"


def feed(given: Given) -> Script:
    """A price feed: the primary is stale (its check fails); another source answers."""
    source = given.inputs["source"]
    if source == "stale":
        return checked("the primary feed is stale", source=source)
    return emits(price=101.5 if source == "primary" else 99.0)


def test_a_fallback_runs_on_check_failed_and_its_outputs_are_the_steps(
    inproc: InStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    programs(inproc, monkeypatch, {"feed(source)": feed, "total(p)": lambda given: emits(total=given.inputs["p"] * 2)})
    steps = [
        {"id": "quote", "run": {"code": "feed(source)"}, "args": {"source": "stale"},
         "fallback": {"name": "backup feed", "on": ["check.failed"], "run": {"code": "feed(source)"},
                      "args": {"source": "b"}}},
        {"id": "total", "run": {"code": "total(p)"}, "args": {"p": {"$ref": "/steps/quote/outputs/price"}}},
    ]  # fmt: skip
    twice = [{**steps[0], "fallback": {**steps[0]["fallback"], "args": {"source": "stale"}}}]  # type: ignore[dict-item]
    with inproc.client() as api, inproc.working():
        run = settled(api, start(api, {"format": "plan/v1", "steps": steps}))
        failed = settled(api, start(api, {"format": "plan/v1", "steps": twice}))
        handoff = api.get(f"/v1/runs/{failed['id']}/handoff").json()

    assert run["status"] == "succeeded", run["events"]
    quote = run["steps"]["quote"]
    assert quote["outputs"] == {"price": 99.0} and run["steps"]["total"]["outputs"] == {"total": 198.0}
    assert len(quote["attempts"]) == 2 and quote["fallback_at"] == 2
    assert quote["fallback_from"]["category"] == "check.failed"
    fell_back = [e for e in run["events"] if e["type"] == "step.fallback"]
    assert len(fell_back) == 1 and "backup feed" in fell_back[0]["detail"]
    assert run["usage"]["replans"] == 0, "the foreseen failure cost no re-plan"
    assert failed["status"] == "needs_replan" and len(failed["steps"]["quote"]["attempts"]) == 2, "it runs once"
    assert handoff["failed"][0]["fallback_from"]["category"] == "check.failed"


def test_a_fallback_never_runs_for_a_write_that_may_have_applied(
    inproc: InStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    programs(inproc, monkeypatch, {
        "pay()": lambda given: checked("the receipt did not parse", outputs={"written": True}),  # wrote, then failed
        "backup()": lambda given: emits(b=1),
        "is_open()": lambda given: emits(open=False),
    })  # fmt: skip
    backup = {"on": ["check.failed", "precondition.failed"], "run": {"code": "backup()"}}
    write = {"id": "pay", "run": {"code": "pay()"}, "effect": "write", "idempotency": {"strategy": "none"},
             "fallback": backup}  # fmt: skip
    closed = {"name": "open", "run": {"code": "is_open()"}, "expect": {"properties": {"open": {"const": True}}}}
    guarded = {**write, "id": "pay2", "preconditions": [closed]}
    with inproc.client() as api, inproc.working():
        run = settled(api, start(api, {"format": "plan/v1", "steps": [write]}))
        second = settled(api, start(api, {"format": "plan/v1", "steps": [guarded]}))

    pay = run["steps"]["pay"]
    assert run["status"] == "needs_replan" and pay["error"]["category"] == "check.failed"
    assert len(pay["attempts"]) == 1 and pay["fallback_from"] is None, "the fallback did not run"
    assert pay["side_effects"] == "possible"
    assert not [e for e in run["events"] if e["type"] == "step.fallback"]
    pay2 = second["steps"]["pay2"]
    assert second["status"] == "succeeded", "its code never started: nothing applied, so the fallback may run"
    assert pay2["fallback_from"]["category"] == "precondition.failed" and pay2["outputs"] == {"b": 1}
    ran = [spec.files[0][1].decode().strip() for spec in inproc.fake.runs]
    assert sorted(ran) == ["backup()", "is_open()", "pay()"], "pay2's own code never ran"


def test_a_token_budget_stops_a_run_with_its_reason(asking: InStack) -> None:
    with asking.client() as api, asking.working():
        run = settled(api, start(api, {**input_plan(), "budgets": {"max_tokens": 1000}}))
        assert run["status"] == "awaiting_input"
        planner = {"model": "m-1", "role": "planner", "input_tokens": 500, "output_tokens": 200, "cost_usd": 0.01,
                   "latency_ms": 900, "call_id": "c1"}  # fmt: skip
        first = api.post(f"/v1/runs/{run['id']}/usage", json=planner).json()
        repeated = api.post(f"/v1/runs/{run['id']}/usage", json=planner).json()
        bad = api.post(f"/v1/runs/{run['id']}/usage", json={**planner, "role": "Planner!", "call_id": "c9"})
        supplier = {"model": "m-1", "role": "supplier", "input_tokens": 250, "output_tokens": 60, "call_id": "c2"}
        over = api.post(f"/v1/runs/{run['id']}/usage", json=supplier).json()

    assert first["usage"]["tokens"] == repeated["usage"]["tokens"] == 700, "a call_id is counted once"
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "role"
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


# The weekly error report, registered in the library: its program counts the ERRO lines of each log
# it was given, writes report.md and emits the total.
LOGS_SCHEMA = {"type": "object", "required": ["logs"],
               "properties": {"logs": {"type": "array", "items": {"type": "string"}}}}  # fmt: skip


def report(given: Given) -> Script:
    errors = {p: given.files.get(p, b"").decode().count("ERRO") for p in sorted(given.inputs["logs"])}
    text = "# Errors\n" + "".join(f"- {p}: {n}\n" for p, n in errors.items())
    return Script(outputs={"errors": sum(errors.values())}, files={"out/report.md": text.encode()})


def register(api: httpx.Client, name: str) -> None:
    outputs = {"type": "object", "required": ["errors"], "properties": {"errors": {"type": "integer"}}}
    body = {"name": name, "version": "1.0.0", "code": "report(logs)", "description": "weekly instrument error report",
            "tags": ["reports"], "input_schema": LOGS_SCHEMA, "output_schema": outputs}  # fmt: skip
    answer = api.post("/v1/scripts", json=body)
    assert answer.status_code == 201, answer.text


def uploaded(api: httpx.Client, contents: dict[str, str]) -> list[dict[str, str]]:
    ids = [api.post("/v1/files", files={"file": (p, text.encode())}).json()["id"] for p, text in contents.items()]
    return [{"path": p, "file_id": f} for p, f in zip(contents, ids, strict=True)]


def test_a_script_steps_policy_and_literal_arguments_are_refused_at_validation_with_nothing_run(
    redis_server: Redis, tmp_path: Path
) -> None:
    policies = policies_with_tenants(
        tmp_path,
        "default: {running: 100, per_minute: 1000, policies: [default, large]}\n"
        "tenants:\n  onlydefault: {running: 100, per_minute: 1000, policies: [default]}\n",
    )
    with in_stack(redis_server, tmp_path, policies_dir=policies) as inproc, inproc.client("onlydefault") as http:
        name = f"reports.narrow_{secrets.token_hex(3)}"
        register(http, name)
        first = {"id": "first", "run": {"code": "print('would run first')"}}
        script = {"id": "report", "run": {"script": f"{name}@1.0.0"}, "args": {"logs": []}, "depends_on": ["first"]}
        larger = {**script, "policy": {"name": "large"}}
        wrong = {**script, "args": {"logs": "not a list"}}
        refusals = {}
        tickets = f"rq:queue:{inproc.settings.queue.name}"
        for label, step in (("policy", larger), ("args", wrong)):
            answer = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [first, step]}})
            refusals[label] = (answer.status_code, [e["field"] for e in answer.json()["errors"]])
        queued = inproc.redis.llen(tickets)
        runs = http.get("/v1/runs").json()
        accepted = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [first, script]}})
        queued_after = inproc.redis.llen(tickets)

    assert refusals == {"policy": (422, ["plan.steps.1.policy.name"]), "args": (422, ["plan.steps.1.args.logs"])}
    assert queued == 0 and runs == [], "nothing was queued and nothing was kept"
    assert accepted.status_code == 201 and accepted.json()["steps"]["first"]["attempts"], "the same plan, allowed"
    assert queued_after == 1, "its first step was queued: the count could have moved"


def test_a_scheduled_success_delivers_its_outputs_to_a_webhook_receiver(
    hooked: tuple[InStack, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    inproc, hooks = hooked
    programs(inproc, monkeypatch, {"report(logs)": report})
    name = f"reports.quiet_{secrets.token_hex(3)}"
    plain = {"a.log": "INFO start\nERRO disk\n", "b.log": "WARN hot\n"}
    secret = "quiet-week-secret-0123456"
    hook = {"url": hooks.url, "secret": secret}

    def succeeded() -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b in hooks.calls if h.get("Execbox-Event") == "script.succeeded"]

    with inproc.client() as api, inproc.working():  # the API's own scheduler fires it
        register(api, name)
        schedule = api.post("/v1/schedules", json={
            "script": f"{name}@1.0.0", "cron": "* * * * * *", "inputs": {"logs": list(plain)},
            "files": uploaded(api, plain), "notify": "all", "webhook": hook}).json()  # fmt: skip
        assert "id" in schedule, schedule
        delivered: Any = wait_until(succeeded, 20, "a quiet firing's report at the webhook")
        api.post(f"/v1/schedules/{schedule['id']}/pause")
        headers, body = delivered[0]
        event = json.loads(body)["event"]
        report_md = api.get(event["artifacts"][0])

    assert signed_by(secret, headers, body), "signed with the schedule's secret"
    assert event["type"] == "script.succeeded" and event["schedule"] == schedule["id"]
    assert event["outputs"] == {"errors": 1} and event["error"] is None
    assert event["artifacts"] == [f"/v1/executions/{event['execution_id']}/artifacts/report.md"]
    assert report_md.status_code == 200 and "a.log: 1" in report_md.text
    assert secret not in body.decode(), "the secret never travels"
