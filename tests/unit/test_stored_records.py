"""Issue #28, from a tenant's side, in-process against a real Redis: what is stored is readable
(findings 4 and 5), a revision cannot drop an approval (16), bad input is a 4xx, never a 500 (15),
and a large body does not hold the event loop (13)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from fastapi.routing import APIRoute

from execbox.api.bodies import OffLoopRoute
from execbox.api.problems import UPLOADS
from execbox.cli import main as cli
from execbox.executions.live import append
from execbox.keyschema import Keys
from execbox.plans.executor import Executor
from execbox.plans.schemas import MAX_PLAN_STEPS
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.unit.conftest import InProcess, make_record

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]


def cell(code: str = "print(1)") -> dict[str, Any]:
    return {"code": code, "language": "python"}


def plan(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"format": "plan/v1", "steps": list(steps), **extra}


def fields(answer: httpx.Response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in answer.json()["errors"]}


class Tenant:
    def __init__(self, api: Api, settings: Settings, client: redis.Redis) -> None:
        self.http, headers = api
        self.headers = headers["alpha"]
        self.client = client
        self.keys = Keys(settings.redis.key_prefix)
        self.settings = settings

    def post(self, url: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.http.post(url, json=body, headers=headers or self.headers)

    def get(self, url: str) -> httpx.Response:
        return self.http.get(url, headers=self.headers)

    def active_runs(self) -> list[Any]:
        return list(self.client.zrange(self.keys.active_runs, 0, -1))

    def readable(self, run_id: str) -> None:
        """The run answers GET, appears in the list, and takes a cancel or usage without a 5xx."""
        one = self.get(f"/v1/runs/{run_id}")
        assert one.status_code == 200, one.text
        listed = self.get("/v1/runs")
        assert listed.status_code == 200 and run_id in {r["id"] for r in listed.json()}, listed.text


@pytest.fixture
def tenant(api: Api, settings: Settings, client: redis.Redis) -> Iterator[Tenant]:
    yield Tenant(api, settings, client)


# -- finding 4: schemas are compiled when the plan is checked, and POST never stores before a 500


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ({"postconditions": {"outputs_schema": {"type": 5}}}, "plan.steps.0.postconditions.outputs_schema"),
        ({"preconditions": [{"run": cell(), "expect": {"$ref": "#/$defs/nowhere"}}]},
         "plan.steps.0.preconditions.0.expect"),
        ({"effect": "write", "idempotency": {"strategy": "status_read", "status_check": {
            "run": cell(), "expect": {"$ref": "https://schemas.example.com/x.json"}}}},
         "plan.steps.0.idempotency.status_check.expect"),
    ],
)  # fmt: skip
def test_a_schema_that_cannot_compile_is_refused_up_front_and_nothing_is_stored(
    tenant: Tenant, where: dict[str, Any], field: str
) -> None:
    bad = plan({"id": "a", "run": cell(), **where})

    checked = tenant.post("/v1/plans/validate", bad)
    created = tenant.post("/v1/runs", {"plan": bad})

    assert checked.status_code == 422 and field in fields(checked), checked.text
    assert created.status_code == 422 and field in fields(created), created.text
    assert tenant.active_runs() == [], "nothing waits in runs:active"
    assert tenant.get("/v1/runs").json() == []


def test_a_goal_with_an_unresolvable_ref_is_refused_instead_of_running_forever(tenant: Tenant) -> None:
    bad = plan({"id": "a", "run": cell()}, goal={"step": "a", "outputs_schema": {"$ref": "#/definitions/none"}})

    created = tenant.post("/v1/runs", {"plan": bad})

    assert created.status_code == 422 and "does not resolve" in fields(created)["plan.goal.outputs_schema"]
    assert tenant.active_runs() == []


def test_a_run_whose_first_advance_fails_is_answered_as_failed_never_a_500_after_storing(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Executor, run: Any) -> None:
        raise RuntimeError("a bug nobody foresaw")

    monkeypatch.setattr(Executor, "step", broken)
    created = tenant.post("/v1/runs", {"plan": plan({"id": "a", "run": cell()})})

    assert created.status_code == 201, created.text
    assert created.json()["status"] == "failed" and created.json()["stop_reason"] == "internal_error"
    assert tenant.active_runs() == [], "it does not fail every round of the plans consumer"
    tenant.readable(created.json()["id"])


# -- finding 5: caps are totals, numbers finite, and an operator can remove a broken record


def gated_run(tenant: Tenant, by: list[str] | None = None) -> dict[str, Any]:
    gate = {"id": "gate", "run": cell(), "approval": {"summary": "go", **({"by": by} if by else {})}}
    created = tenant.post("/v1/runs", {"plan": plan(gate, budgets={"max_steps": MAX_PLAN_STEPS})})
    assert created.status_code == 201 and created.json()["status"] == "awaiting_approval", created.text
    body: dict[str, Any] = created.json()
    return body


def test_revisions_cannot_grow_a_run_past_the_steps_its_record_holds(tenant: Tenant) -> None:
    run = gated_run(tenant)
    waiting = [{"id": f"s{i}", "run": cell(), "depends_on": ["gate"]} for i in range(MAX_PLAN_STEPS - 1)]
    full = tenant.post(f"/v1/runs/{run['id']}/revisions", {"base_revision": 1, "add": waiting})
    assert full.status_code == 200 and len(full.json()["steps"]) == MAX_PLAN_STEPS, full.text

    one_more = tenant.post(f"/v1/runs/{run['id']}/revisions", {"base_revision": 2, "add": [
        {"id": "extra", "run": cell(), "depends_on": ["gate"]}]})  # fmt: skip

    assert one_more.status_code == 422, one_more.text
    assert f"at most {MAX_PLAN_STEPS}" in fields(one_more)["revision.add"]
    tenant.readable(run["id"])
    assert tenant.post(f"/v1/runs/{run['id']}/cancel", {}).status_code == 200


def test_a_number_out_of_range_is_refused_and_the_run_stays_readable(tenant: Tenant) -> None:
    run = gated_run(tenant)
    raw = {**tenant.headers, "Content-Type": "application/json"}

    usage = tenant.http.post(f"/v1/runs/{run['id']}/usage", content=b'{"cost_usd": 1e400}', headers=raw)
    nan = tenant.http.post(f"/v1/runs/{run['id']}/usage", content=b'{"latency_ms": NaN}', headers=raw)
    budget = tenant.http.post(
        "/v1/runs",
        headers=raw,
        content=b'{"plan": {"format": "plan/v1", "budgets": '
        b'{"max_cost_usd": 1e999}, "steps": [{"id": "a", "run": {"code": "print(1)"}}]}}',
    )
    execution = tenant.http.post("/v1/executions", headers=raw,
                                 content=b'{"code": "print(1)", "policy": {"cpu": 1e400}}')  # fmt: skip

    assert usage.status_code == 422 and "cost_usd" in fields(usage), usage.text
    assert nan.status_code == 422 and "latency_ms" in fields(nan), nan.text
    assert budget.status_code == 422 and "plan.budgets.max_cost_usd" in fields(budget), budget.text
    assert execution.status_code == 422 and "policy.cpu" in fields(execution), execution.text
    tenant.readable(run["id"])
    assert tenant.get(f"/v1/runs/{run['id']}").json()["usage"]["cost_usd"] == 0.0


def test_an_operator_removes_an_unreadable_run_with_the_cli(
    tenant: Tenant, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = gated_run(tenant)
    stored = json.loads(tenant.client.get(tenant.keys.run(run["id"])) or b"{}")
    stored["usage"]["cost_usd"] = None  # what 1e400 became under the old code
    tenant.client.set(tenant.keys.run(run["id"]), json.dumps(stored))
    assert tenant.get("/v1/runs").status_code == 200, "one broken record does not fail the tenant's list"

    monkeypatch.setenv("EXECBOX_REDIS__URL", settings.redis.url)
    monkeypatch.setenv("EXECBOX_REDIS__KEY_PREFIX", settings.redis.key_prefix)
    assert cli(["records", "rm", "run", run["id"]]) == 0

    assert tenant.client.get(tenant.keys.run(run["id"])) is None and tenant.active_runs() == []
    assert tenant.get(f"/v1/runs/{run['id']}").status_code == 404
    assert tenant.get(f"/v1/approvals/{run['steps']['gate']['approval_id']}").status_code == 404
    assert cli(["records", "rm", "run", run["id"]]) == 1, "a second removal finds nothing"


# -- finding 16: a revision cannot drop an approval


def test_a_key_refused_the_decision_cannot_remove_the_gated_step_and_add_it_back(
    tenant: Tenant, settings: Settings
) -> None:
    approver_key, approver = ApiKeys(tenant.client, settings.redis.key_prefix).create("alpha")
    run = gated_run(tenant, by=[approver.key_id])
    approval_id = run["steps"]["gate"]["approval_id"]
    swap = {"base_revision": 1, "remove": ["gate"], "add": [{"id": "again", "run": cell()}], "reason": "faster"}

    decided = tenant.post(f"/v1/approvals/{approval_id}/decision", {"decision": "approve"})
    revised = tenant.post(f"/v1/runs/{run['id']}/revisions", swap)

    assert decided.status_code == 403
    assert revised.status_code == 403 and revised.json()["code"] == "approval.forbidden"
    assert "remove.0" in fields(revised)
    after = tenant.get(f"/v1/runs/{run['id']}").json()
    assert set(after["steps"]) == {"gate"} and after["steps"]["gate"]["status"] == "awaiting_approval"
    assert after["revision"] == 1 and after["usage"]["steps_dispatched"] == 0, "nothing of the swap ran"

    allowed = tenant.post(f"/v1/runs/{run['id']}/revisions", swap, {"Authorization": f"Bearer {approver_key}"})

    assert allowed.status_code == 200, allowed.text
    closed = tenant.get(f"/v1/approvals/{approval_id}").json()
    assert closed["status"] == "rejected" and "removed by revision 2: faster" in closed["reason"]


# -- finding 15: bad input is a 4xx, never a 500


def test_a_cron_that_never_fires_is_refused(tenant: Tenant) -> None:
    answer = tenant.post("/v1/schedules", {"script": "tick@1.0.0", "cron": "0 0 31 2 *"})

    assert answer.status_code == 422 and "never fires" in fields(answer)["cron"], answer.text


def test_schedules_below_the_policy_interval_or_past_the_tenant_cap_are_refused(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    quota = tenant.http.app.state.services.quotas.quota("alpha")
    every_second = tenant.post("/v1/schedules", {"script": "tick@1.0.0", "cron": "* * * * * *"})
    assert every_second.status_code == 422 and "at most one firing every 60 s" in fields(every_second)["cron"]

    monkeypatch.setattr(quota, "schedules", 0)
    capped = tenant.post("/v1/schedules", {"script": "tick@1.0.0", "cron": "0 3 * * *"})
    assert capped.status_code == 422 and "its policy's limit" in capped.json()["detail"], capped.text


def test_a_slot_claim_lapses_within_a_day_of_its_slot(tenant: Tenant) -> None:
    store = tenant.http.app.state.services.schedules.store
    now = time.time()

    assert store.claim("sch_" + "a" * 26, now)
    ttl = tenant.client.ttl(tenant.keys.slot("sch_" + "a" * 26, f"{now:.3f}"))

    assert 0 < ttl <= 86400 + 300, ttl


def live_execution(tenant: Tenant, settings: Settings, ended: bool) -> tuple[str, str]:
    """An execution of tenant alpha with a status event, and an end event when `ended`: (id, newest event id)."""
    record = make_record(settings)
    tenant.http.app.state.services.store.create(record)
    with tenant.client.pipeline() as pipe:
        append(pipe, tenant.keys, record.id, "status", {"status": "queued"}, 60)
        if ended:
            append(pipe, tenant.keys, record.id, "end", {}, 60)
        pipe.execute()
    newest: Any = tenant.client.xrevrange(tenant.keys.stream(record.id), count=1)
    return record.id, newest[0][0].decode()


def test_a_last_event_id_above_2_64_is_refused_before_the_stream(tenant: Tenant, settings: Settings) -> None:
    execution_id, _ = live_execution(tenant, settings, ended=False)
    huge = {**tenant.headers, "Last-Event-ID": f"{2**64}-0"}

    answer = tenant.http.get(f"/v1/executions/{execution_id}/events", headers=huge)

    assert answer.status_code == 422 and "header.Last-Event-ID" in fields(answer), answer.text


@pytest.mark.parametrize("resume", ["at", "after"])
def test_resuming_at_or_after_the_end_gets_the_end_at_once(tenant: Tenant, settings: Settings, resume: str) -> None:
    execution_id, end_id = live_execution(tenant, settings, ended=True)
    last = end_id if resume == "at" else "99999999999999-7"

    headers = {**tenant.headers, "Last-Event-ID": last}
    started = time.monotonic()
    read = tenant.http.http.get(f"/v1/executions/{execution_id}/events", headers=headers)
    answer = tenant.http.run(asyncio.wait_for(read, 5))  # keep-alives for ever: a timeout
    elapsed = time.monotonic() - started

    assert answer.status_code == 200 and f"id: {end_id}\nevent: end\n" in answer.text, answer.text
    assert ": keepalive" not in answer.text and elapsed < settings.api.sse_keepalive_s, elapsed


def test_an_mcp_tool_error_shows_a_trace_id_not_the_exception(tenant: Tenant) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "upload_file", "arguments": {"name": "a.txt", "content_b64": "abcde"}}}  # fmt: skip
    headers = {**tenant.headers, "Accept": "application/json, text/event-stream", "Host": "localhost:8000"}

    answer = tenant.http.post("/mcp/", json=call, headers=headers)

    assert answer.status_code == 200, answer.text
    (data,) = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: ")]
    result = json.loads(data)["result"]  # the answer is an event stream (progress may precede it)
    text = result["content"][0]["text"]
    assert result["isError"] and "trace" in text, text
    assert "base64" not in text.lower() and "padding" not in text.lower() and "Error(" not in text, text


# -- finding 13: bodies are parsed off the event loop, and capped per route


def big_plan(rows: int) -> bytes:
    """A 1000-step plan whose arguments are many small values (what costs most to parse and check)."""
    values = [{"n": i, "ok": True} for i in range(rows)]
    return json.dumps(plan(*({"id": f"s{i}", "run": cell(), "args": {"rows": values}} for i in range(1000)))).encode()


def test_large_bodies_do_not_hold_healthz(tenant: Tenant, settings: Settings) -> None:
    bodies = [big_plan(530), big_plan(150)]  # 12 MiB as in the report, and one just under the JSON cap
    http = tenant.http
    headers = {**tenant.headers, "Content-Type": "application/json"}
    done, latencies = threading.Event(), [0.0]

    def probe() -> None:  # another client: its /healthz waits while the loop is held
        while not done.is_set():
            started = time.perf_counter()
            health = http.run(http.http.get("/healthz"), 30)
            assert health.status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)

    async def post_all() -> list[int]:
        return [(await http.http.post("/v1/plans/validate", content=b, headers=headers)).status_code for b in bodies]

    prober = threading.Thread(target=probe)
    prober.start()
    began = time.perf_counter()
    try:
        statuses = http.run(post_all())
        took = time.perf_counter() - began
    finally:
        done.set()
        prober.join()
    worst = max(latencies)

    sizes = " and ".join(f"{len(b) / 2**20:.1f} MiB" for b in bodies)
    sys.stderr.write(
        f"\n/healthz worst latency during POST /v1/plans/validate of {sizes}: {worst * 1000:.0f} ms "
        f"(the POSTs took {took * 1000:.0f} ms)\n"
    )
    assert statuses[0] == 413 and statuses[1] in (200, 422), statuses
    # Held by the loop, a probe would wait about as long as the POSTs take (seconds); off the loop
    # it waits only for the GIL (json.loads is one C call). Half the POSTs' own time, measured in
    # the same run, tells the two apart on a quiet machine and on CI's busy one alike.
    assert worst < max(0.5, took / 2), f"/healthz waited {worst:.2f} s while the POSTs took {took:.2f} s"
    assert len(bodies[1]) <= settings.api.max_json_body_bytes < len(bodies[0])


def test_bodies_are_capped_per_route(tenant: Tenant, settings: Settings) -> None:
    too_big_for_json = b"{" + b" " * settings.api.max_json_body_bytes + b"}"
    headers = {**tenant.headers, "Content-Type": "application/json"}

    control = tenant.http.post("/v1/plans/validate", content=too_big_for_json, headers=headers)
    upload = tenant.http.post("/v1/executions", content=too_big_for_json, headers=headers)

    assert control.status_code == 413 and control.json()["code"] == "request.too_large"
    assert "POST /v1/files" in control.json()["detail"]
    assert upload.status_code != 413, "an upload route takes more than a control route"
    assert settings.api.max_body_bytes < 1 << 30 and UPLOADS == ("/v1/executions", "/v1/files", "/e2b/sandbox/files")


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, inside included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # FastAPI keeps an included router's routes as they were
            yield from api_routes(route.original_router.routes)


def test_every_route_with_a_json_body_parses_it_off_the_event_loop(tenant: Tenant) -> None:
    with_body = [r for r in api_routes(tenant.http.app.routes) if r.body_field is not None]

    assert with_body and all(isinstance(r, OffLoopRoute) for r in with_body), [
        r.path for r in with_body if not isinstance(r, OffLoopRoute)
    ]
