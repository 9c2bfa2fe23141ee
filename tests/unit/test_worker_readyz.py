"""Issue 44 (known, not yet fixed): workers had no /readyz (their metrics server answered every path
with the metrics, 200). A worker's /readyz is 200 only while Redis and its sandbox runtime answer, 503
naming what does not, within its check timeout even when the engine hangs; /metrics is unchanged."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from execbox.core.errors import ServiceError
from execbox.sandbox.errors import RuntimeUnavailable
from execbox.settings import Settings
from execbox.worker import health
from execbox.worker.context import WorkerContext
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_reaper_and_pool import context

pytestmark = pytest.mark.redis


class Worker:
    def __init__(self, ctx: WorkerContext, engine: FakeEngine) -> None:
        self.ctx, self.engine = ctx, engine
        self.server = health.serve(ctx, 0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10)


@pytest.fixture
def worker(settings: Settings, client: redis.Redis, tmp_path: Path) -> Iterator[Worker]:
    engine = FakeEngine()
    found = Worker(context(settings, client, engine, tmp_path), engine)
    yield found
    found.server.shutdown()
    found.server.server_close()


def test_a_worker_whose_redis_and_engine_answer_is_ready(worker: Worker) -> None:
    answer = worker.get("/readyz")

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "ready", "checks": {"redis": {"ok": True}, "engine": {"ok": True}}}
    metrics = worker.get("/metrics")
    assert metrics.status_code == 200 and "execbox_" in metrics.text


def test_a_worker_whose_engine_is_down_is_not_ready_naming_it(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> None:
        raise RuntimeUnavailable("Docker engine unreachable")

    monkeypatch.setattr(worker.engine, "ping", down)
    answer = worker.get("/readyz")

    assert answer.status_code == 503, answer.text
    assert answer.json()["checks"]["engine"] == {"ok": False, "detail": "Docker engine unreachable"}


def test_a_worker_without_redis_is_not_ready(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    def down() -> None:
        raise ServiceError("Redis unavailable")

    monkeypatch.setattr(worker.ctx.store, "ping", down)
    answer = worker.get("/readyz")

    assert answer.status_code == 503 and answer.json()["checks"]["redis"]["ok"] is False, answer.text


def test_a_hung_engine_makes_the_probe_answer_503_within_its_timeout(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    unstick = threading.Event()
    monkeypatch.setattr(worker.engine, "ping", unstick.wait)
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.5)
    try:
        answer = worker.get("/readyz")
    finally:
        unstick.set()

    assert answer.status_code == 503, answer.text
    assert answer.json()["checks"]["engine"]["detail"].startswith("no answer within")
