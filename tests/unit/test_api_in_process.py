"""The API in-process (ASGI, no sockets) against a real Redis: what a client sees without a worker."""

from __future__ import annotations

import time

import pytest
import redis

from execbox.executions.queue import depth, make_queue
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.fleet.registry import Heartbeat, WorkerRegistry
from execbox.keyschema import Keys
from execbox.settings import Settings
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
PROGRAM = {"language": "python", "code": "print('hi')"}
Api = tuple[InProcess, dict[str, dict[str, str]]]


def test_an_accepted_execution_is_stored_queued_and_owned(api: Api, settings: Settings, client: redis.Redis) -> None:
    http, as_ = api
    created = http.post("/v1/executions", json=PROGRAM, headers=as_["alpha"])

    assert created.status_code == 202, created.text
    body = created.json()
    assert body["status"] == "queued" and created.headers["Location"] == f"/v1/executions/{body['id']}"
    assert created.headers["X-Trace-Id"] == body["trace_id"] and "code" not in body
    assert depth(make_queue(client, settings)) == 1
    assert http.get(f"/v1/executions/{body['id']}", headers=as_["alpha"]).json()["status"] == "queued"
    hidden = http.get(f"/v1/executions/{body['id']}", headers=as_["beta"])
    assert hidden.status_code == 404 and hidden.json()["code"] == "execution.not_found", "no leak across tenants"
    assert http.get(f"/v1/executions/{body['id']}").status_code == 401


def test_cancelling_a_queued_execution_settles_it_once(api: Api) -> None:
    http, as_ = api
    execution_id = http.post("/v1/executions", json=PROGRAM, headers=as_["alpha"]).json()["id"]

    cancelled = http.post(f"/v1/executions/{execution_id}/cancel", headers=as_["alpha"])
    again = http.post(f"/v1/executions/{execution_id}/cancel", headers=as_["alpha"])

    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["error"]["category"] == "cancelled"
    assert again.status_code == 409 and again.json()["code"] == "execution.finished"
    assert http.post(f"/v1/executions/{execution_id}/cancel", headers=as_["beta"]).status_code == 404


def test_a_retry_with_the_same_key_replays_the_first_execution(
    api: Api, settings: Settings, client: redis.Redis
) -> None:
    http, as_ = api
    headers = {**as_["alpha"], "Idempotency-Key": "retry-me"}
    first = http.post("/v1/executions", json=PROGRAM, headers=headers)
    retry = http.post("/v1/executions", json=PROGRAM, headers=headers)
    changed = http.post("/v1/executions", json={**PROGRAM, "code": "print(2)"}, headers=headers)

    assert retry.json()["id"] == first.json()["id"] and retry.headers["Idempotent-Replayed"] == "true"
    assert changed.status_code == 422 and changed.json()["code"] == "idempotency.mismatch"
    assert depth(make_queue(client, settings)) == 1, "one execution queued in all"


def test_invalid_requests_name_every_field(api: Api) -> None:
    http, as_ = api
    bad = {"language": "python", "code": " ", "policy": {"memory_mb": 1}, "env": {"EXECBOX_X": "1"}}

    answer = http.post("/v1/executions", json=bad, headers=as_["alpha"])

    assert answer.status_code == 422 and answer.headers["content-type"] == "application/problem+json"
    fields = {e["field"] for e in answer.json()["errors"]}
    assert {"code", "policy.memory_mb", "env"} <= fields, fields
    above = http.post("/v1/executions", json={**PROGRAM, "policy": {"memory_mb": 1 << 19}}, headers=as_["alpha"])
    assert above.status_code == 422 and above.json()["code"] == "request.policy_exceeded"


def test_a_runtime_no_live_worker_offers_is_refused(api: Api, settings: Settings, client: redis.Redis) -> None:
    http, as_ = api
    WorkerRegistry(client, Keys(settings.redis.key_prefix)).report(Heartbeat("w1", True, runtimes=["runc"]), 60)

    answer = http.post("/v1/executions", json={**PROGRAM, "policy": {"runtime": "runsc"}}, headers=as_["alpha"])

    assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "policy.runtime"
    assert depth(make_queue(client, settings)) == 0
    assert client.zcard(Keys(settings.redis.key_prefix).active("alpha")) == 0, "a refusal takes no quota slot"


def test_shared_gauges_sum_the_live_workers_heartbeats(api: Api, settings: Settings, client: redis.Redis) -> None:
    http, _ = api
    fleet = WorkerRegistry(client, Keys(settings.redis.key_prefix))
    fleet.report(Heartbeat("w1", True, warm=2), 60)
    fleet.report(Heartbeat("w2", False, detail="engine down", warm=1), 60)

    metrics = http.get("/metrics").text

    assert "execbox_warm_pool_size 3.0" in metrics
    assert "execbox_workers_alive 2.0" in metrics and "execbox_workers_docker_ok 1.0" in metrics


def test_a_waiting_client_is_answered_when_the_execution_ends(
    api: Api, settings: Settings, client: redis.Redis
) -> None:
    http, as_ = api
    execution_id = http.post("/v1/executions", json=PROGRAM, headers=as_["alpha"]).json()["id"]
    store = ExecutionStore(client, settings)

    def finish() -> None:
        store.transition(execution_id, {ExecutionStatus.QUEUED}, "w", lambda r: ExecutionStatus.RUNNING)
        store.transition(execution_id, {ExecutionStatus.RUNNING}, "w", lambda r: ExecutionStatus.SUCCEEDED)

    started = time.monotonic()
    answer = http.wait_while(f"/v1/executions/{execution_id}?wait=20", as_["alpha"], finish)

    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    assert time.monotonic() - started < 2, "woken by the done channel, not by the end of the 20 s wait"


def test_a_run_wait_past_events_needs_a_wait(api: Api) -> None:
    http, as_ = api
    plan = {"format": "plan/v1", "steps": [{"id": "a", "run": {"code": "print(1)"}}]}
    run = http.post("/v1/runs", json={"plan": plan}, headers=as_["alpha"]).json()

    answer = http.get(f"/v1/runs/{run['id']}?after=0", headers=as_["alpha"])

    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == ["query.after"]
    started = time.monotonic()
    behind = http.get(f"/v1/runs/{run['id']}?wait=5&after={len(run['events']) - 1}", headers=as_["alpha"])
    assert behind.json()["status"] == "running" and time.monotonic() - started < 2, "more events than seen: at once"
