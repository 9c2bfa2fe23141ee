"""A stopping worker is gone within its grace whatever its warm pool, refills and deferred removals are
blocked in (issue 44: a pooled worker still ran 30 s after SIGTERM): a bounded drain, then a hard stop
that leaves only what the reaper can find by its labels."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from execbox.core.errors import ServiceError
from execbox.sandbox.docker.cleanup import Deferred
from execbox.sandbox.pool import PoolClass, WarmPool
from execbox.sandbox.runtime import SandboxSpec
from execbox.settings import Settings
from execbox.worker import main
from tests.conftest import wait_until
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_reaper_and_pool import context, template

pytestmark = pytest.mark.redis
GRACE_S = 1.0


class StuckEngine(FakeEngine):
    """An engine whose creations, removals and clean-up block until `unstick` is set (an engine call
    that sits out its whole API timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.unstick = threading.Event()
        self.creating = 0
        self.lock = threading.Lock()

    def create_pooled(self, spec: SandboxSpec, pool_class: str) -> str:
        with self.lock:
            self.creating += 1
        self.unstick.wait()
        return super().create_pooled(spec, pool_class)

    def remove(self, container_id: str) -> None:
        self.unstick.wait()
        super().remove(container_id)

    def close(self) -> None:
        self.unstick.wait()
        super().close()


def test_a_worker_stops_within_its_grace_while_refills_are_stuck_in_the_engine(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    engine = StuckEngine()
    ctx = context(settings, client, engine, tmp_path)
    ctx.pool = WarmPool(engine, [PoolClass("python", template("worker-under-test"), 2, 2)], ctx.name, "d", 300.0)
    stop = threading.Event()
    ctx.pool.start(stop)
    wait_until(lambda: engine.creating == 2, 10, "two refills in flight", step_s=0.01)

    try:
        stop.set()
        began = time.monotonic()
        main.shut_down(ctx, None, GRACE_S)
        took = time.monotonic() - began

        assert took < GRACE_S + 0.5, f"the stop took {took:.1f} s with a grace of {GRACE_S} s"
        stuck = [t.name for t in threading.enumerate() if t.name.startswith("warm-pool") and not t.daemon]
        assert not stuck, f"threads that would hold the interpreter at exit: {stuck}"
    finally:
        engine.unstick.set()
    # The creations the stop did not wait for end later and remove what they made.
    wait_until(lambda: len(engine.removed) == 2 and not engine.containers, 10, "the late containers' removal")
    assert ctx.pool.idle() == {"python": 0}


def test_a_flush_of_deferred_removals_returns_by_its_timeout() -> None:
    deferred = Deferred(delay_s=3600.0)  # pending until flushed
    unstick = threading.Event()
    done: list[str] = []

    def stuck() -> None:  # a removal the engine does not answer
        unstick.wait()

    deferred.later(lambda: done.append("quick"))
    deferred.later(stuck)

    try:
        began = time.monotonic()
        deferred.flush(GRACE_S)
        took = time.monotonic() - began
    finally:
        unstick.set()

    assert took < GRACE_S + 0.5, f"the flush took {took:.1f} s with a timeout of {GRACE_S} s"
    assert done == ["quick"], "every pending action ran, at once"


def test_a_stop_asked_while_waiting_for_redis_ends_the_wait(
    settings: Settings, client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(main, "_stopping", threading.Event())
    ctx = context(settings, client, FakeEngine(), tmp_path)

    def down() -> None:
        raise ServiceError("Redis unavailable")

    monkeypatch.setattr(ctx.store, "ping", down)
    waiting = threading.Thread(target=main._wait_for_redis, args=(ctx,), daemon=True)
    waiting.start()
    main._stopping.set()  # what the signal handlers do
    waiting.join(GRACE_S)

    assert not waiting.is_alive(), "the wait for Redis outlived the stop request"


def test_a_stop_during_a_job_is_kept_beyond_rq_s_worker_object(
    settings: Settings, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ keeps a stop asked during a job on its worker object; when Redis is lost, run_worker makes a new
    one, which must not serve again."""
    monkeypatch.setattr(main, "_stopping", threading.Event())
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    worker = main.RQWorker(["q"], connection=client)
    try:
        worker.set_state("busy")
        worker.request_stop(signal.SIGTERM, None)  # in a job: RQ only notes it
        assert main._stopping.is_set()
        successor = main.RQWorker(["q"], connection=client)
        successor._install_signal_handlers()
        assert successor._stop_requested, "the new worker would take another job"
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])


def test_a_worker_held_past_its_hard_stop_exits_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else holds a stopping worker (RQ's teardown, an atexit hook), the process ends."""
    exited = threading.Event()
    monkeypatch.setattr(main, "_hard_stop", None)
    monkeypatch.setattr(os, "_exit", lambda code: exited.set())
    monkeypatch.setattr(logging, "shutdown", lambda: None)

    main.arm_hard_stop(0.05)

    assert exited.wait(5), "the hard stop never fired"


def test_rq_s_teardown_after_a_stop_arms_the_hard_stop(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    armed: list[float] = []
    monkeypatch.setattr(main, "_stopping", threading.Event())
    monkeypatch.setattr(main, "arm_hard_stop", armed.append)
    worker = main.RQWorker(["q"], connection=client)

    worker.teardown()  # a Redis outage leaves the loop too: no stop asked, nothing armed
    main._stopping.set()
    worker.teardown()

    assert armed == [main.HARD_STOP_S]
