"""Nodes and drains (execbox.fleet.nodes): node names, heartbeats of other versions, the per-node view,
the admin routes in-process, and the RQ worker's hold-off, with the in-memory sandbox and the
session's real redis-server. tests/integration/test_drain.py does it with worker processes and Docker."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from pydantic import SecretStr, ValidationError
from rq import Queue

from execbox.api import create_app
from execbox.executions.queue import enqueue, make_queue
from execbox.executions.status import ExecutionStatus
from execbox.fleet.nodes import Nodes, node_problem, valid_node
from execbox.fleet.registry import Heartbeat, WorkerRegistry
from execbox.keyschema import Keys
from execbox.sandbox.fake import FakeRuntime
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.worker import context
from execbox.worker.context import WorkerContext
from execbox.worker.main import RQWorker
from execbox.worker.reaper import report_health
from execbox.worker.tasks import run_next
from tests.unit.conftest import InProcess, make_record

pytestmark = pytest.mark.redis
TOKEN = "n" * 32


@pytest.mark.parametrize("name", ["a", "worker-1", "node_2.example.org", "A" * 128, "1host"])
def test_a_host_name_is_a_node_name(name: str) -> None:
    assert valid_node(name) and node_problem(name) is None


@pytest.mark.parametrize("name", ["", "-a", ".a", "a b", "a:b", "a/b", "n\u00e9", "a\n", "A" * 129, "*"])
def test_anything_else_is_refused_with_what_a_name_is(name: str) -> None:
    assert not valid_node(name)
    assert "1 to 128 letters, digits" in str(node_problem(name))


def test_the_node_setting_is_checked_when_it_is_read() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(worker={"node": "no spaces"})
    assert raised.value.errors()[0]["loc"] == ("worker", "node")
    assert Settings(worker={"node": "host-7"}).worker.node == "host-7"


def test_heartbeats_of_an_older_and_a_newer_version_both_read(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis.key_prefix)
    client.set(keys.worker("old"), json.dumps({"name": "old", "docker_ok": True, "at": 1.0}))
    client.set(keys.worker("new"), json.dumps({"name": "new", "docker_ok": True, "node": "n1", "gpu": 2, "at": 2.0}))
    beats = {beat.name: beat for beat in WorkerRegistry(client, keys).alive()}
    assert (beats["old"].node, beats["old"].draining) == ("", False), "defaults for what an older worker lacks"
    assert beats["new"].node == "n1", "a field this version does not know is dropped, not fatal"


def test_the_view_places_running_executions_by_the_node_of_their_lease_holder(
    settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis.key_prefix)
    fleet, nodes = WorkerRegistry(client, keys), Nodes(client, keys)
    for name, node in (("w1", "node-a"), ("w2", "node-a"), ("w3", "node-b")):
        fleet.report(Heartbeat(name, True, node=node, draining=name == "w1"), 60)
    first = nodes.drain("node-a")
    assert nodes.drain("node-a") == first, "a second drain keeps the first time"
    nodes.drain("node-c")  # no worker there yet: drained before it starts
    for _ in range(3):
        nodes.count_finished("node-b")
    holders = {"exe_1": "w1", "exe_2": "w2", "exe_3": "w3", "exe_4": "gone-worker"}
    views = {view.node: view for view in nodes.overview(holders)}
    assert sorted(views) == ["node-a", "node-b", "node-c"]
    a, b, c = views["node-a"], views["node-b"], views["node-c"]
    assert (a.workers, a.draining_workers, a.drained, a.running, a.finished) == (("w1", "w2"), 1, True, 2, 0)
    assert (b.workers, b.drained, b.running, b.finished) == (("w3",), False, 1, 3)
    assert (c.workers, c.drained, c.running, c.last_heartbeat) == ((), True, 0, None)
    assert a.drained_at == first and a.last_heartbeat is not None
    assert nodes.undrain("node-a") and not nodes.undrain("node-a")
    assert not nodes.drained("node-a") and nodes.drained("node-c")
    assert nodes.view("node-z", {}).workers == ()


@pytest.fixture
def admin_api(settings: Settings, client: redis.Redis) -> Iterator[tuple[InProcess, dict[str, str]]]:
    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": SecretStr(TOKEN)})})
    tenant_key = ApiKeys(client, settings.redis.key_prefix).create("alpha")[0]
    http = InProcess(create_app(admin))
    yield http, {"Authorization": f"Bearer {tenant_key}"}
    http.close()


def test_the_admin_routes_drain_list_and_undrain_a_node(
    admin_api: tuple[InProcess, dict[str, str]], settings: Settings, client: redis.Redis
) -> None:
    http, tenant = admin_api
    operator = {"Authorization": f"Bearer {TOKEN}"}
    WorkerRegistry(client, Keys(settings.redis.key_prefix)).report(Heartbeat("w1", True, node="node-a"), 60)
    drained = http.post("/v1/admin/nodes/node-a/drain", headers=operator)
    assert drained.status_code == 200, drained.text
    assert drained.json()["drained"] is True and drained.json()["workers"] == ["w1"]
    listed = http.get("/v1/admin/nodes", headers=operator).json()
    assert [(n["node"], n["drained"], n["running"], n["finished"]) for n in listed] == [("node-a", True, 0, 0)]
    undrained = http.delete("/v1/admin/nodes/node-a/drain", headers=operator)
    assert undrained.status_code == 200 and undrained.json()["drained"] is False
    assert http.delete("/v1/admin/nodes/node-a/drain", headers=operator).status_code == 200, "repeatable"


def test_a_tenant_key_is_refused_and_a_bad_node_name_is_422_naming_the_field(
    admin_api: tuple[InProcess, dict[str, str]],
) -> None:
    http, tenant = admin_api
    operator = {"Authorization": f"Bearer {TOKEN}"}
    assert http.get("/v1/admin/nodes", headers=tenant).status_code == 403
    assert http.post("/v1/admin/nodes/node-a/drain", headers=tenant).status_code == 403
    for bad in ("a%20b", "-a", "x" * 129, "a%3Ab"):
        answer = http.post(f"/v1/admin/nodes/{bad}/drain", headers=operator)
        assert answer.status_code == 422, (bad, answer.text)
        assert "node" in answer.text


@pytest.fixture
def worker_ctx(settings: Settings, client: redis.Redis) -> Iterator[WorkerContext]:
    on_a = settings.model_copy(update={"worker": settings.worker.model_copy(update={"node": "node-a"})})
    ctx = WorkerContext.build(on_a, "w-node-a", FakeRuntime())
    context.install(ctx)
    yield ctx
    context._current = None
    ctx.store.redis.close()


def _queue_one(ctx: WorkerContext) -> str:
    record = make_record(ctx.settings)
    ctx.store.create(record)
    enqueue(make_queue(ctx.store.redis, ctx.settings), record, "", ctx.settings, 60)
    return record.id


def test_an_execution_records_its_node_and_is_counted_for_it(worker_ctx: WorkerContext) -> None:
    execution_id = _queue_one(worker_ctx)
    assert run_next({}) == execution_id
    record = worker_ctx.store.get(execution_id)
    assert record is not None and record.status is ExecutionStatus.SUCCEEDED and record.node == "node-a"
    (view,) = worker_ctx.nodes.overview({})
    assert (view.node, view.finished) == ("node-a", 1)
    counted = worker_ctx.registry.get_sample_value(
        "execbox_node_executions_total", {"node": "node-a", "status": "succeeded"}
    )
    assert counted == 1.0


def test_a_drained_worker_says_so_in_its_heartbeat_and_offers_no_session_slot(worker_ctx: WorkerContext) -> None:
    worker_ctx.nodes.drain("node-a")
    report_health(worker_ctx)
    (beat,) = [b for b in worker_ctx.fleet.alive() if b.name == "w-node-a"]
    assert (beat.node, beat.draining, beat.session_slots) == ("node-a", True, 0)
    assert worker_ctx.registry.get_sample_value("execbox_worker_draining") == 1.0
    worker_ctx.nodes.undrain("node-a")
    report_health(worker_ctx)
    (beat,) = [b for b in worker_ctx.fleet.alive() if b.name == "w-node-a"]
    assert not beat.draining and beat.session_slots == worker_ctx.settings.sessions.per_worker


def test_a_ticket_dequeued_as_the_drain_came_goes_back_to_the_front_untouched(worker_ctx: WorkerContext) -> None:
    queue = make_queue(worker_ctx.store.redis, worker_ctx.settings)
    execution_id = _queue_one(worker_ctx)
    _queue_one(worker_ctx)
    worker = RQWorker([queue], connection=worker_ctx.store.redis, serializer=queue.serializer, name="w-rq")
    taken = Queue.dequeue_any([queue], None, connection=worker_ctx.store.redis, serializer=queue.serializer)
    assert taken is not None
    job, _ = taken
    worker_ctx.nodes.drain("node-a")
    worker.execute_job(job, queue)
    assert queue.job_ids[0] == job.id and queue.count == 2, "back at the front, beside the other ticket"
    assert worker_ctx.store.redis.llen(queue.intermediate_queue_key) == 0
    record = worker_ctx.store.get(execution_id)
    assert record is not None and record.status is ExecutionStatus.QUEUED and record.worker is None


def test_a_drained_worker_does_not_dequeue_until_undrained(worker_ctx: WorkerContext) -> None:
    queue = make_queue(worker_ctx.store.redis, worker_ctx.settings)
    worker = RQWorker([queue], connection=worker_ctx.store.redis, serializer=queue.serializer, name="w-rq2")
    worker_ctx.nodes.drain("node-a")
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(worker.dequeue_job_and_maintain_ttl(30)), daemon=True)
    waiting.start()
    _queue_one(worker_ctx)
    # Nothing to await: the point is that nothing happens. Three drain looks' worth of time.
    time.sleep(1.5)
    assert queue.count == 1 and not got, "the ticket stays for another node's worker"
    undrained = time.monotonic()
    worker_ctx.nodes.undrain("node-a")
    waiting.join(10)
    assert got and got[0] is not None, "undrained: it takes the ticket"
    assert time.monotonic() - undrained < 2.5, "seen within about a second"
    assert worker.get_state() != "suspended"
