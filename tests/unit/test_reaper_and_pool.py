"""The reaper's rules and the warm pool against a fake engine, with the real Redis stores."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from execbox.catalog.languages import Languages
from execbox.core.tracing import setup as setup_tracing
from execbox.egress.store import EgressStore
from execbox.executions import lifecycle
from execbox.executions.metrics import worker_metrics
from execbox.executions.queue import enqueue, make_queue, take_next
from execbox.executions.store import ExecutionStore
from execbox.files.blobs import LocalArtifactStore
from execbox.files.store import FileStore
from execbox.fleet.metrics import node_metrics
from execbox.fleet.nodes import DrainWatch, Nodes
from execbox.fleet.registry import Heartbeat, WorkerRegistry
from execbox.keyschema import Keys
from execbox.sandbox.pool import PoolClass, Sizing, WarmPool
from execbox.sandbox.poolsize import Demand, within_budget
from execbox.sandbox.runtime import Limits, SandboxSpec
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from execbox.tenancy.quotas import Slots
from execbox.worker import reaper
from execbox.worker.context import WorkerContext
from tests.conftest import wait_until
from tests.unit.conftest import make_record
from tests.unit.fake_engine import FakeEngine

pytestmark = pytest.mark.redis
LIMITS = Limits(10.0, 1.0, 10, 256, 64, 64, 1 << 20)


def context(settings: Settings, client: redis.Redis, engine: FakeEngine, tmp_path: Path) -> WorkerContext:
    keys = Keys(settings.redis.key_prefix)
    registry = CollectorRegistry()
    return WorkerContext(
        settings=settings, store=ExecutionStore(client, settings), files=FileStore(client, keys),
        egress=EgressStore(client, keys, settings.retention_s), fleet=WorkerRegistry(client, keys),
        slots=Slots(client, keys), runtime=engine, languages=Languages.load(settings.images_dir),
        artifacts=LocalArtifactStore(tmp_path / "artifacts"), name="worker-under-test",
        metrics=worker_metrics(registry), registry=registry, spans=setup_tracing(None, "test"),
        sessions=SessionStore(client, keys, settings.retention_s), backstop_s=60,
        node="node-under-test", nodes=Nodes(client, keys), drain=DrainWatch(Nodes(client, keys), "node-under-test"),
        node_metrics=node_metrics(registry),
    )  # fmt: skip


def test_an_unowned_container_is_removed_on_the_second_sweep_only(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    engine = FakeEngine()
    ctx = context(settings, client, engine, tmp_path)
    orphan = engine.add(execution_id="exe_gone")  # its execution's lease has lapsed
    leased = engine.add(execution_id="exe_running")
    ctx.store.renew_lease("exe_running", "another-worker")
    young = engine.add(execution_id="exe_new", age_s=0.0)  # within the grace period
    unowned: set[str] = set()

    first = reaper.sweep(ctx, unowned)
    assert first["containers"] == 0 and engine.removed == [], "one sweep never removes"
    assert unowned == {orphan}

    second = reaper.sweep(ctx, unowned)
    assert second["containers"] == 1 and engine.removed == [orphan]
    assert set(engine.containers) == {leased, young}


def test_a_sweep_puts_back_an_entry_taken_by_a_worker_that_never_marked_it_running(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    """A fail-over lost the worker's move to running after its take: the sweep puts the entry back
    and restores its ticket, and the next take runs it."""
    ctx = context(settings, client, FakeEngine(), tmp_path)
    queue = make_queue(client, settings)
    record = make_record(settings)
    ctx.store.create(record)
    enqueue(queue, record, f"00-{record.trace_id}-{'1' * 16}-01", settings, backstop_s=60)
    client.lpop(queue.key)  # the worker's ticket
    lost = take_next(client, settings)  # ... and its take; nothing after it reached Redis
    assert lost is not None
    taken_at = client.zscore(Keys(settings.redis.key_prefix).taken(settings.queue.name), lost.raw)
    assert taken_at is not None
    client.zadd(Keys(settings.redis.key_prefix).taken(settings.queue.name),
                {lost.raw: taken_at - settings.worker.lease_s - 1})  # a lease ago: past the grace  # fmt: skip

    counts = reaper.sweep(ctx)

    assert (counts["entries"], counts["tickets"]) == (1, 1)
    again = take_next(client, settings)
    assert again is not None and again.execution_id == record.id
    assert lifecycle.take(ctx, record.id) is not None, "the record was still queued"


def test_a_container_owned_again_between_sweeps_is_kept(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    engine = FakeEngine()
    ctx = context(settings, client, engine, tmp_path)
    cid = engine.add(execution_id="exe_slow_redis")
    unowned: set[str] = set()
    reaper.sweep(ctx, unowned)
    ctx.store.renew_lease("exe_slow_redis", "its-worker")  # Redis came back; the worker renewed

    reaper.sweep(ctx, unowned)

    assert engine.removed == [] and cid in engine.containers and unowned == set()


def test_a_warm_container_belongs_to_its_live_worker(settings: Settings, client: redis.Redis, tmp_path: Path) -> None:
    engine = FakeEngine()
    ctx = context(settings, client, engine, tmp_path)
    mine = engine.add(worker="alive", pool="python")
    theirs = engine.add(worker="gone", pool="python")
    ctx.fleet.report(Heartbeat("alive", True), ttl_s=60)

    reaper.sweep(ctx, None)  # `execbox reap`: one sweep removes at once

    assert engine.removed == [theirs] and mine in engine.containers


def template(worker: str = "w1") -> SandboxSpec:
    return SandboxSpec(execution_id="", trace_id="", worker=worker, image="execbox/python:test", command=("python3",),
                   files=(), env=(), limits=LIMITS, language="python", deployment="d", runtime="runc")  # fmt: skip


def test_the_warm_pool_fills_hands_out_once_and_refills() -> None:
    engine = FakeEngine()
    takes: list[bool] = []
    pool = WarmPool(
        engine, [PoolClass("python", template(), 2, 2)], "w1", "d", 300.0, on_take=lambda _, hit: takes.append(hit)
    )
    stop = threading.Event()
    pool.tick(stop)
    assert pool.idle() == {"python": 2}

    bigger = LIMITS.__class__(**{**LIMITS.__dict__, "memory_mb": 512})
    run = SandboxSpec(**{**template().__dict__, "limits": bigger})
    first, second, third = pool.take(run), pool.take(run), pool.take(run)

    assert first and second and first != second and third is None, "each container serves one run"
    assert takes == [True, True, False]
    assert engine.resized == [(first, bigger), (second, bigger)], "memory is set to the run's own"
    pool.tick(stop)
    assert pool.idle() == {"python": 2}
    other = SandboxSpec(**{**template().__dict__, "image": "execbox/bash:test"})
    assert pool.take(other) is None, "a spec of no class goes cold without counting a take"
    assert takes == [True, True, False]


def test_a_preloaded_class_never_shrinks_below_its_memory() -> None:
    plain = PoolClass("python", template(), 1, 1)
    preloaded = PoolClass("python", dataclasses.replace(template(), container_env=(("EXECBOX_PRELOAD", "py"),)), 1, 1)
    smaller = dataclasses.replace(template(), limits=dataclasses.replace(LIMITS, memory_mb=128))
    larger = dataclasses.replace(template(), limits=dataclasses.replace(LIMITS, memory_mb=512))
    assert plain.fits(smaller) and plain.fits(larger)
    assert not preloaded.fits(smaller) and preloaded.fits(larger) and preloaded.fits(template())


def test_the_warm_pool_replaces_dead_and_stale_containers() -> None:
    engine = FakeEngine()
    pool = WarmPool(engine, [PoolClass("python", template(), 2, 2)], "w1", "d", max_idle_s=3600.0)
    stop = threading.Event()
    pool.tick(stop)
    dead = next(iter(engine.containers))
    engine.die(dead)

    pool.tick(stop)
    handed = {pool.take(template()), pool.take(template())}

    assert None not in handed and dead not in handed, "a container that died while waiting is never handed out"
    stale = WarmPool(engine, [PoolClass("python", template("w2"), 1, 1)], "w2", "d", max_idle_s=0.0)
    stale.tick(stop)
    (waited,) = [c for c, info in engine.containers.items() if info.worker == "w2"]
    stale.tick(stop)  # it waited longer than max_idle_s = 0: recycled, then replaced
    assert waited in engine.removed
    assert stale.take(template("w2")) not in (None, waited)


def test_the_heartbeat_reports_the_warm_containers_waiting(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    engine = FakeEngine()
    ctx = context(settings, client, engine, tmp_path)
    ctx.pool = WarmPool(engine, [PoolClass("python", template(ctx.name), 2, 2)], ctx.name, "d", 300.0)
    ctx.pool.tick(threading.Event())

    reaper.report_health(ctx)

    (beat,) = ctx.fleet.alive()
    assert (beat.name, beat.docker_ok, beat.warm, beat.runtimes) == (ctx.name, True, 2, ["runc"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_class_grows_with_a_burst_within_its_bounds_and_falls_back_when_quiet() -> None:
    clock = Clock()
    demand = Demand(window_s=60.0, clock=clock)
    demand.refilled(0.3)  # the measured refill time replaces the first guess in steps
    assert demand.target(1, 4) == 1, "a quiet class holds its floor"
    for _ in range(3):  # three calls within one refill time
        demand.took()
        clock.now += 0.05
    assert demand.target(1, 4) == 3
    for _ in range(10):
        demand.took()
    assert demand.target(1, 4) == 4, "never above the ceiling"
    clock.now += 61
    assert demand.target(1, 4) == 1, "the burst left the window"
    for _ in range(5):  # one call every two seconds is served by refills alone
        demand.took()
        clock.now += 2
    assert demand.target(0, 4) == 1
    clock.now += 61
    for back in (4.0, 4.1, 4.2):  # a burst taken one by one behind a slow run: counted when it arrived
        demand.took(arrived_at=clock.now - back)
    assert demand.target(0, 4) == 3


def test_a_pool_class_with_max_below_min_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"max \(1\) is below min \(2\)"):
        Settings(pool={"classes": [{"language": "python", "min": 2, "max": 1}]})


def test_a_budget_keeps_every_floor_and_shares_the_rest_round_robin() -> None:
    assert within_budget([4, 4], [1, 1], [256, 256], 1024) == [2, 2]
    assert within_budget([4, 1], [1, 1], [256, 256], 1024) == [3, 1]
    assert within_budget([2, 2], [2, 2], [256, 256], 256) == [2, 2], "floors are kept above the budget"


def test_the_pool_follows_its_arrivals_and_sheds_the_surplus() -> None:
    engine, clock = FakeEngine(), Clock()
    pool = WarmPool(engine, [PoolClass("python", template(), 1, 4)], "w1", "d", 300.0, Sizing(window_s=60.0),
                    clock=clock)  # fmt: skip
    stop = threading.Event()
    pool.tick(stop)
    assert pool.idle() == {"python": 1}
    taken = [pool.take(template()) for _ in range(3)]  # a burst: one warm, two cold
    assert taken[0] is not None and taken[1:] == [None, None]
    pool.tick(stop)
    assert pool.idle() == {"python": 3}, "the next burst of three finds three"
    clock.now += 61
    pool.tick(stop)
    assert pool.idle() == {"python": 1} and len(engine.removed) == 2, "the surplus is removed once the burst is old"


def test_a_budget_caps_what_the_arrivals_ask_for() -> None:
    engine = FakeEngine()
    pool = WarmPool(engine, [PoolClass("python", template(), 1, 8)], "w1", "d", 300.0, Sizing(budget_mb=3 * 256))
    for _ in range(8):
        pool.take(template())
    pool.tick(threading.Event())
    assert pool.idle() == {"python": 3} and pool.targets() == {"python": 3}


def test_no_refill_starts_while_a_run_is_in_progress_unless_asked() -> None:
    engine = FakeEngine()
    pool = WarmPool(engine, [PoolClass("python", template(), 2, 2)], "w1", "d", 300.0)
    pool.run_started()
    pool.tick(threading.Event())
    assert pool.idle() == {"python": 0}
    pool.run_ended()
    pool.tick(threading.Event())
    assert pool.idle() == {"python": 2}
    eager = WarmPool(engine, [PoolClass("python", template(), 2, 2)], "w1", "d", 300.0,
                     Sizing(refill_during_runs=True))  # fmt: skip
    eager.run_started()
    eager.tick(threading.Event())
    assert eager.idle() == {"python": 2}


class BlockingEngine(FakeEngine):
    """Creation blocks until released; counts how many creations are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.in_flight = 0
        self.most = 0
        self.lock = threading.Lock()

    def create_pooled(self, spec: SandboxSpec, pool_class: str) -> str:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        self.release.wait(10)
        with self.lock:
            self.in_flight -= 1
        return super().create_pooled(spec, pool_class)


def test_refills_run_at_most_parallelism_at_once_and_a_take_never_waits_for_one() -> None:
    engine = BlockingEngine()
    pool = WarmPool(engine, [PoolClass("python", template(), 5, 5)], "w1", "d", 300.0, Sizing(parallelism=2))
    stop = threading.Event()
    filling = threading.Thread(target=pool.tick, args=(stop,))
    filling.start()
    wait_until(lambda: engine.in_flight == 2, 10, "two creations in flight", step_s=0.01)
    assert pool.take(template()) is None, "an empty pool answers at once while refills are in flight"
    engine.release.set()
    filling.join(10)
    assert pool.idle() == {"python": 5} and engine.most == 2


def test_the_budget_is_shared_with_the_other_workers_on_the_engine() -> None:
    engine = FakeEngine()
    for _ in range(2):  # another worker's warm containers, 256 MiB each by their label
        engine.add(worker="w2", pool="python", pool_memory_mb=256)
    pool = WarmPool(engine, [PoolClass("python", template(), 1, 8)], "w1", "d", 300.0, Sizing(budget_mb=5 * 256))
    for _ in range(8):
        pool.take(template())
    pool.tick(threading.Event())
    assert pool.idle() == {"python": 3}, "five fit the budget, two of them are the other worker's"
