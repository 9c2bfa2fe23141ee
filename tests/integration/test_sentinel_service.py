"""The service on Redis that survives its primary (issue 30, item 2): the API (in-process) and a
worker (RQ's SimpleWorker on the fake sandbox) both given a sentinel:// setting with their own ACL
roles, on a real primary, replica and three Sentinels (scripts/redis-ha). The primary is SIGKILLed
with an execution queued; after the promotion both executions end and read back through the API,
acceptances wait for a replica (refused with a retryable 503 while there is none) and are accepted
again once the killed node is back as the new primary's replica. Nothing is restarted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer

from execbox.api import create_app
from execbox.core.redis_roles import role_url
from execbox.executions.queue import make_queue
from execbox.sandbox.fake import FakeRuntime
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.worker import context
from execbox.worker.context import WorkerContext
from tests.conftest import PASSWORDS, PREFIX, wait_until
from tests.integration.test_sentinel import HA, running_ha
from tests.unit.conftest import InProcess

pytestmark = [pytest.mark.slow]

TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "expired"}


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HA]:
    yield from running_ha(tmp_path_factory.mktemp("redis-ha-service"))


def _settings(ha: HA, role: str, tmp_path: Path) -> Settings:
    url = role_url(ha.env["REDIS_HA_URL"], role, PASSWORDS[role])
    redis_section = {
        "url": url,
        "key_prefix": PREFIX,
        "socket_timeout_s": 2,
        "accept_replicas": 1,
        "accept_wait_ms": 1000,
    }
    return Settings(redis=redis_section, queue={"name": f"{PREFIX}-ha"}, artifacts_dir=tmp_path / "artifacts")


class Service:
    def __init__(self, ha: HA, tmp_path: Path) -> None:
        admin = ha.client("admin")
        self.headers = {"Authorization": f"Bearer {ApiKeys(admin, PREFIX).create('alpha')[0]}"}
        admin.close()
        self.http = InProcess(create_app(_settings(ha, "api", tmp_path)))
        self.worker_settings = _settings(ha, "worker", tmp_path)
        self.ctx = WorkerContext.build(self.worker_settings, "w-ha", FakeRuntime())
        context.install(self.ctx)

    def submit(self, code: str, key: str | None = None) -> Any:
        headers = {**self.headers, **({"Idempotency-Key": key} if key else {})}
        return self.http.post("/v1/executions", json={"language": "python", "code": code}, headers=headers)

    def get(self, execution_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/executions/{execution_id}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    def work(self) -> None:
        """RQ's worker, on the worker role's Sentinel client, until its queue is empty."""
        redis_client = self.ctx.store.redis
        queue = make_queue(redis_client, self.worker_settings)
        SimpleWorker([queue], connection=redis_client, serializer=JSONSerializer).work(burst=True, with_scheduler=False)

    def close(self) -> None:
        self.http.close()
        context._current = None
        self.ctx.store.redis.close()


@pytest.fixture
def service(ha: HA, tmp_path: Path) -> Iterator[Service]:
    running = Service(ha, tmp_path)
    yield running
    running.close()


def test_executions_queued_before_the_primary_dies_end_and_acceptance_resumes_without_a_restart(
    ha: HA, service: Service
) -> None:
    first = service.submit("print('before')")
    assert first.status_code == 202, first.text
    service.work()
    assert service.get(first.json()["id"])["status"] == "succeeded"
    queued = service.submit("print('across')")
    assert queued.status_code == 202, queued.text
    harness = ha.node(ha.primary_port())
    wait_until(lambda: _replica_caught_up(harness), 10, "the replica to hold the finished execution")

    old, killed_at = ha.kill_primary()
    ha.await_promotion(old)
    promoted_s = time.monotonic() - killed_at

    # One data node left: an acceptance no replica holds is refused, retryable, not promised.
    # The API's pooled connections to the dead primary are replaced by ones to the new primary on
    # the first request (redis-py alone retried the dead address until it gave up: a 503).
    asked = time.monotonic()
    assert service.get(first.json()["id"])["status"] == "succeeded"
    read_s = time.monotonic() - asked
    asked = time.monotonic()
    refused = service.submit("print('alone')")
    refused_s = time.monotonic() - asked
    assert refused.status_code == 503 and refused.json()["retryable"] is True, refused.text
    service.work()  # the queued execution's ticket outlived the primary
    after = {e: service.get(e) for e in (first.json()["id"], queued.json()["id"])}
    assert {e: r["status"] for e, r in after.items()} == dict.fromkeys(after, "succeeded")
    assert after[queued.json()["id"]]["stdout"] == "across\n"

    ha.restore()
    accepted = _accepted(service)
    service.work()
    assert service.get(accepted)["status"] == "succeeded"
    print(  # noqa: T201
        f"promotion {promoted_s:.2f} s after SIGKILL; first read after it {read_s:.2f} s; first acceptance refused "
        f"in {refused_s:.2f} s; accepted again {time.monotonic() - killed_at:.2f} s after the SIGKILL (node restarted)"
    )


def _replica_caught_up(primary: redis.Redis) -> bool:
    info: dict[str, Any] = primary.info("replication")
    offset = info["master_repl_offset"]
    return any(isinstance(v, dict) and int(v.get("offset", -1)) >= offset for v in info.values())


def _accepted(service: Service) -> str:
    """Submit until the restored node is a replica again and acknowledges the acceptance; one
    Idempotency-Key, so the refused attempts and the accepted one are a single execution."""

    def once() -> str | None:
        answer = service.submit("print('after')", key="after-the-fail-over")
        if answer.status_code == 503:
            return None
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    return str(wait_until(once, 30, "an acceptance acknowledged by the restored replica", step_s=0.2))
