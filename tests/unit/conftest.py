"""The fast tier: pure logic, plus the stores and the API in-process against the session's real
redis-server (from PATH). Nothing here needs root, Docker or a network beyond loopback.

Each test gets a key prefix (and queue) of its own, through the harness's unrestricted Redis
user, so tests never see each other's keys or the integration stack's.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI

from execbox.api import create_app
from execbox.catalog.policies import PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.core.redis import connect
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import Transition
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import new_execution_id
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.conftest import Redis
from tests.unit.stack import InStack, in_stack


@pytest.fixture
def settings(redis_server: Redis, tmp_path: Path) -> Settings:
    prefix = f"u{secrets.token_hex(4)}"
    return Settings(
        redis={"url": redis_server.url, "key_prefix": prefix},
        queue={"name": prefix},
        artifacts_dir=tmp_path / "artifacts",
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    connection = connect(settings)
    yield connection
    for key in connection.scan_iter(match=f"{settings.redis.key_prefix}:*", count=1000):
        connection.delete(key)
    connection.close()


def make_record(settings: Settings, tenant: str = "alpha", queue_timeout_s: float = 60.0) -> ExecutionRecord:
    """A queued execution as the API would store it (default policy, a one-line program)."""
    policy = PolicySet.load(settings.policies_dir).resolve(PolicyRequest(queue_timeout_s=queue_timeout_s), 9)
    now = time.time()
    return ExecutionRecord(
        id=new_execution_id(),
        tenant=tenant,
        status=ExecutionStatus.QUEUED,
        language="python",
        trace_id=secrets.token_hex(16),
        created_at=now,
        policy=policy,
        code="print(1)\n",
        request_sha256="0" * 64,
        queue_deadline=now + queue_timeout_s,
        transitions=[Transition(status=ExecutionStatus.QUEUED, at=now, by="api")],
    )


class InProcess:
    """Requests straight into the ASGI app (httpx's ASGI transport) on a loop of the test's own,
    with the app's lifespan (the waiters' Redis subscription) around them."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        ready, self._stop = asyncio.Event(), asyncio.Event()

        async def lifespan() -> None:  # entered and left in one task, as a server does (anyio requires it)
            async with app.router.lifespan_context(app):
                ready.set()
                await self._stop.wait()

        self._lifespan = self._loop.create_task(lifespan())
        self._loop.run_until_complete(ready.wait())
        self._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://execbox.test")

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._http.get(url, **kwargs))

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._http.post(url, **kwargs))

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._http.delete(url, **kwargs))

    def wait_while(self, url: str, headers: dict[str, str], action: Any) -> httpx.Response:
        """GET url while `action` runs in a thread beside it (the request is in flight meanwhile)."""

        async def both() -> httpx.Response:
            answer, _ = await asyncio.gather(self._http.get(url, headers=headers), asyncio.to_thread(action))
            return answer

        return self._loop.run_until_complete(both())

    def close(self) -> None:
        self._loop.run_until_complete(self._http.aclose())
        self._stop.set()
        self._loop.run_until_complete(self._lifespan)
        self._loop.close()


@pytest.fixture
def api(settings: Settings, client: redis.Redis) -> Iterator[tuple[InProcess, dict[str, dict[str, str]]]]:
    keys = ApiKeys(client, settings.redis.key_prefix)
    headers = {tenant: {"Authorization": f"Bearer {keys.create(tenant)[0]}"} for tenant in ("alpha", "beta")}
    http = InProcess(create_app(settings))
    yield http, headers
    http.close()


@pytest.fixture
def inproc(redis_server: Redis, tmp_path: Path) -> Iterator[InStack]:
    """The in-process stack (tests/unit/stack.py) with the unit settings; for settings of a test's
    own, `with in_stack(redis_server, tmp_path, **updates) as inproc:`."""
    with in_stack(redis_server, tmp_path) as made:
        yield made
