"""Issue #28, findings 1 to 4, from the attacker's side against a real Redis and the app in-process:
one message or record that a loop cannot handle used to stop that loop for every tenant. Each test
plants the poison, then measures how late another tenant's events, webhooks, schedule slots and
plan timers are handled while it is present (printed), with a bound a stalled loop would miss."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from execbox.api import create_app
from execbox.core.deadletters import DeadLetters
from execbox.core.metrics import loop_metrics
from execbox.core.poison import Loops
from execbox.core.streams import TERMINAL
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, Webhook
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.keyschema import LOOPS, Keys
from execbox.plans.consumer import PlanConsumer
from execbox.schedules.schemas import ScheduleCreate
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.webhooks.delivery import WebhookConsumer
from execbox.worker import reaper
from tests.conftest import free_port, wait_until
from tests.unit.conftest import InProcess, make_record
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_reaper_and_pool import context

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]
BAD_URL = "http://hooks.example.com/\x01"
SCRIPT = {"name": "tick", "version": "1.0.0", "code": "print(1)", "input_schema": {"type": "object"}}


def fail(store: ExecutionStore, execution_id: str) -> float:
    """End a queued execution as failed (as a worker would); the time it ended."""
    store.transition(execution_id, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)

    def failed(record: ExecutionRecord) -> ExecutionStatus:
        record.error = ExecutionError(category=ErrorCategory.CHECK_FAILED, message="check failed", retryable=False)
        return ExecutionStatus.FAILED

    ended = time.time()
    store.transition(execution_id, {ExecutionStatus.RUNNING}, "test", failed)
    return ended


def unreadable_events(client: redis.Redis, keys: Keys, n: int) -> list[str]:
    """`n` ended executions whose records cannot be read (as an older version could store them)."""
    ids = [f"exe_{secrets.token_hex(13)}" for _ in range(n)]
    for execution_id in ids:
        client.set(keys.execution(execution_id), json.dumps({"id": execution_id, "status": "failed"}))
        client.xadd(keys.events, {"type": TERMINAL, "id": execution_id, "status": "failed"})
    return ids


def test_finding_1_other_tenants_surprises_keep_their_timing_while_an_event_cannot_be_handled(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    http, as_ = api
    store, keys = ExecutionStore(client, settings), Keys(settings.redis.key_prefix)
    # The report's request: a failing execution carrying the service's own link labels, forged.
    forged = http.post("/v1/executions", headers=as_["alpha"], json={"language": "python", "code": "exit(3)",
                       "labels": {"execbox.script": "x@1.0.0", "execbox.slot": "not-a-number"}})  # fmt: skip
    if forged.status_code == 202:  # refused outright (422) where `execbox.` labels are the service's
        fail(store, forged.json()["id"])
    unreadable_events(client, keys, 20)  # and events no consumer can handle, whatever the reason
    assert http.post("/v1/scripts", json=SCRIPT, headers=as_["beta"]).status_code == 201

    delays = []
    for _ in range(3):
        invoked = http.post("/v1/scripts/tick/invoke", json={"version": "1.0.0"}, headers=as_["beta"])
        execution_id = invoked.json()["id"]
        ended = fail(store, execution_id)

        def seen(execution_id: str = execution_id) -> bool:
            events = http.get("/v1/events?type=script.failed", headers=as_["beta"]).json()
            return any(e["execution_id"] == execution_id for e in events)

        wait_until(seen, 10, "beta's surprise while the poison is present")
        delays.append(time.time() - ended)
    print(f"beta's script.failed events recorded {max(delays):.2f} s after the failure at worst")  # noqa: T201
    assert max(delays) < 2.0, delays
    ready = http.get("/readyz").json()["checks"]["loops"]
    assert ready["ok"] and ready["loops"]["surprises"]["restarts"] == 0, ready
    assert 'execbox_poison_total{loop="surprises"} 0.0' not in http.get("/metrics").text, "the poison was counted"


class Receiver:
    """A webhook receiver on loopback: when each execution's delivery arrived."""

    def __init__(self) -> None:
        arrivals: dict[str, float] = {}
        self.arrivals = arrivals

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                arrivals[self.headers["Execbox-Execution-Id"]] = time.time()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_finding_2_a_webhook_url_no_request_can_be_sent_to_is_refused_at_registration(
    client: redis.Redis, settings: Settings
) -> None:
    """The host is one the operator allows, and the URL passed the pattern: the delivery thread
    died on it. Now every surface that registers a webhook refuses it, naming the field."""
    allowing = settings.model_copy(update={"webhooks": settings.webhooks.model_copy(
        update={"allow_hosts": ["hooks.example.com"]})})  # fmt: skip
    as_ = {"alpha": {"Authorization": f"Bearer {ApiKeys(client, settings.redis.key_prefix).create('alpha')[0]}"}}
    http = InProcess(create_app(allowing))
    try:
        _refused_everywhere(http, as_, client, settings)
    finally:
        http.close()


def _refused_everywhere(
    http: InProcess, as_: dict[str, dict[str, str]], client: redis.Redis, settings: Settings
) -> None:
    hook = {"url": BAD_URL, "secret": "s" * 20}
    attempts = {
        "/v1/executions": {"language": "python", "code": "print(1)", "webhook": hook},
        "/v1/runs": {"plan": {"format": "plan/v1", "steps": [{"id": "a", "run": {"code": "print(1)"}}]},
                     "webhook": hook},
        "/v1/schedules": {"script": "tick@1.0.0", "cron": "0 * * * *", "webhook": hook},
    }  # fmt: skip
    assert http.post("/v1/scripts", json=SCRIPT, headers=as_["alpha"]).status_code == 201
    before = set(client.scan_iter(match=f"{settings.redis.key_prefix}:*"))
    for route, body in attempts.items():
        answer = http.post(route, json=body, headers=as_["alpha"])
        assert answer.status_code == 422, (route, answer.text)
        assert "webhook" in answer.text and "no request can be sent to this URL" in answer.text, answer.text
    assert set(client.scan_iter(match=f"{settings.redis.key_prefix}:*")) == before, "nothing stored"


def test_finding_2_other_tenants_webhooks_keep_their_timing_while_a_delivery_cannot_be_made(
    client: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """An entry whose delivery raises (its execution's record cut short, so that it no longer reads; a
    URL no request can be made of is only a failed attempt now, test_kept_records_stay_usable.py) is retried
    with backoff, then set aside; beta's deliveries go on."""
    hooks = settings.webhooks.model_copy(update={"allow_hosts": ["127.0.0.1", "hooks.example.com"],
                                                 "claim_idle_s": 5.0})  # fmt: skip
    store, keys = ExecutionStore(client, settings), Keys(settings.redis.key_prefix)
    poison = make_record(settings, tenant="alpha")
    poison.webhook = Webhook(url="http://hooks.example.com/h", secret="s" * 20)
    store.create(poison)
    fail(store, poison.id)
    stored: Any = client.get(keys.execution(poison.id))
    client.set(keys.execution(poison.id), stored[: len(stored) // 2])
    registry = CollectorRegistry()
    consumer = WebhookConsumer(store, hooks, "w1", loop_metrics(registry))
    consumer.guard.backoff_s = 0.2  # attempts 0.2, 0.4, 0.8, 1.6 s apart: set aside within the test
    stop = threading.Event()
    loops = Loops(stop, LOOPS, loop_metrics(CollectorRegistry()))
    loops.start("webhooks", consumer.run)
    delays = []
    try:
        for _ in range(8):  # beta's executions end while the poison is being retried
            record = make_record(settings, tenant="beta")
            record.webhook = Webhook(url=f"http://127.0.0.1:{receiver.port}/hook", secret="t" * 20)
            store.create(record)
            ended = fail(store, record.id)
            wait_until(lambda record=record: record.id in receiver.arrivals, 10, "beta's webhook")  # type: ignore[misc]
            delays.append(receiver.arrivals[record.id] - ended)
            time.sleep(0.4)  # spread over the poison's retries, as real traffic is
        wait_until(lambda: DeadLetters(client, keys, LOOPS).list("webhooks"), 15, "the poison to be set aside")
    finally:
        stop.set()
        loops.join(5)
    print(f"beta's webhooks delivered {max(delays):.2f} s after the end at worst")  # noqa: T201
    assert max(delays) < 1.5, delays
    (letter,) = DeadLetters(client, keys, LOOPS).list("webhooks")
    assert letter.fields == {"type": TERMINAL, "id": poison.id, "status": "failed"} and letter.attempts == 5
    assert loops.status()["webhooks"].restarts == 0
    assert registry.get_sample_value("execbox_poison_total", {"loop": "webhooks"}) == 5


def test_finding_3_a_schedule_that_cannot_fire_does_not_hold_up_another_tenants_every_second_schedule(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    http, as_ = api
    services = http.app.state.services
    scheduler, keys = services.schedules, Keys(settings.redis.key_prefix)
    for tenant in ("alpha", "beta"):
        assert http.post("/v1/scripts", json=SCRIPT, headers=as_[tenant]).status_code == 201
    # The report's schedule: a 300-character label, which the execution's own validation refuses.
    labelled = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * * *"))
    scheduler.store.put(labelled.model_copy(update={"labels": {"note": "x" * 300}}), 0.0)  # first in line
    # And a schedule record that cannot even be read, also first in line.
    client.set(keys.schedule("sch_" + "z" * 26), "{not json")
    client.zadd(keys.schedules_due, {"sch_" + "z" * 26: 0})

    every_second = scheduler.create("beta", ScheduleCreate(script="tick@1.0.0", cron="* * * * * *"))
    wait_until(lambda: len(scheduler.store.firings(every_second.id)) >= 4, 10, "beta's slots to be handled")
    firings = scheduler.store.firings(every_second.id)
    lateness = [f.at - f.slot for f in firings]
    print(f"beta's every-second slots handled {max(lateness):.2f} s after their time at worst")  # noqa: T201
    assert max(lateness) < 1.5 and all(f.status != "skipped_misfire" for f in firings), firings
    (refused, *_) = scheduler.store.firings(labelled.id)
    assert refused.status == "not_started", refused
    assert http.get("/readyz").json()["checks"]["loops"]["loops"]["scheduler"]["restarts"] == 0


def test_finding_4_an_approval_expires_on_time_while_64_broken_runs_are_due(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    http, as_ = api
    keys = Keys(settings.redis.key_prefix)
    for n in range(64):  # alpha's runs that fail at every advance, all due first (score 0)
        run_id = f"run_{secrets.token_hex(13)}"
        client.set(keys.run(run_id), json.dumps({"id": run_id, "tenant": "alpha", "broken": n}))
        client.zadd(keys.active_runs, {run_id: 0})
    gated = {"id": "pay", "run": {"code": "print(1)"}, "approval": {"summary": "pay", "expires_in_s": 2}}
    created = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [gated]}}, headers=as_["beta"])
    assert created.status_code == 201, created.text
    approval_id = created.json()["steps"]["pay"]["approval_id"]
    approval = http.get(f"/v1/approvals/{approval_id}", headers=as_["beta"]).json()

    def expired() -> float | None:
        now = time.time()
        status = http.get(f"/v1/approvals/{approval_id}", headers=as_["beta"]).json()["status"]
        return now if status == "expired" else None

    seen = wait_until(expired, 15, "beta's approval to expire")
    late = float(seen) - approval["expires_at"]  # type: ignore[arg-type]
    print(f"beta's approval expired {late:.2f} s after its expiry time with 64 broken runs due")  # noqa: T201
    assert late < 1.5, late
    assert http.get("/readyz").json()["checks"]["loops"]["loops"]["plans"]["restarts"] == 0
    metrics = http.get("/metrics").text
    counted = [line for line in metrics.splitlines() if line.startswith('execbox_poison_total{loop="plans"}')]
    attempts = float(counted[0].split()[-1])
    assert 64 <= attempts <= 64 * 4, f"each broken run tried with backoff, not at every round: {attempts}"


def test_the_reaper_settles_other_tenants_lost_work_in_a_sweep_that_meets_unreadable_records(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    """The reaper has no queue to set a record aside in: one it cannot read is logged and counted,
    and the same sweep settles the others (one bad record used to end every sweep there)."""
    ctx = context(settings, client, FakeEngine(), tmp_path)
    keys = Keys(settings.redis.key_prefix)
    broken_execution, broken_session = f"exe_{secrets.token_hex(13)}", f"ses_{secrets.token_hex(13)}"
    client.set(keys.execution(broken_execution), "{not json")
    client.sadd(keys.running, broken_execution)
    client.set(keys.session(broken_session), "{not json")
    client.zadd(keys.live_sessions, {broken_session: 0})
    lost = make_record(settings, tenant="beta")
    ctx.store.create(lost)
    ctx.store.transition(lost.id, {ExecutionStatus.QUEUED}, "worker-gone", lambda r: ExecutionStatus.RUNNING)

    counts = reaper.sweep(ctx)

    assert counts["lost"] == 1, counts
    settled = ctx.store.get(lost.id)
    assert settled is not None and settled.error is not None and settled.error.category is ErrorCategory.SANDBOX_ERROR
    poison = ctx.registry.get_sample_value("execbox_poison_total", {"loop": "reaper"})
    assert poison == 2, "the unreadable execution and session, each counted"


def test_a_run_set_aside_after_its_last_attempt_ends_failed_rather_than_running_for_ever(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    """A run whose every advance raises (here its step's execution record no longer reads) is set
    aside as a dead letter, and its owner sees it ended: failed, `internal_error`, the reason given."""
    http, as_ = api
    keys = Keys(settings.redis.key_prefix)
    plan = {"format": "plan/v1", "steps": [{"id": "a", "run": {"code": "print(1)"}}]}
    run = http.post("/v1/runs", json={"plan": plan}, headers=as_["alpha"]).json()
    client.set(keys.execution(run["steps"]["a"]["attempts"][-1]), "{not json")
    consumer = PlanConsumer(http.app.state.services.runs.executor, "poison-test", idle_s=5.0)
    consumer.guard.backoff_s = 0.0  # every round is its next attempt

    def ended() -> str | None:
        client.zadd(keys.active_runs, {run["id"]: 0}, xx=True)  # due now, while it is still active
        consumer.advance_due()
        status: str = http.get(f"/v1/runs/{run['id']}", headers=as_["alpha"]).json()["status"]
        return status if status != "running" else None

    assert wait_until(ended, 15, "the run to be set aside") == "failed"
    body = http.get(f"/v1/runs/{run['id']}", headers=as_["alpha"]).json()
    assert body["stop_reason"] == "internal_error", body
    assert "set aside after its last attempt" in body["events"][-1]["detail"], body["events"][-1]
    assert [letter.item for letter in DeadLetters(client, keys, LOOPS).list("plans")] == [run["id"]]
    assert client.zscore(keys.active_runs, run["id"]) is None, "no longer due"
