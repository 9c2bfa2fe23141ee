"""Which Redis clients a sentinel:// setting gives every component (without a Sentinel: only how
they are built), and the acceptance's WAIT against the session's lone redis-server, which has no
replica to acknowledge anything."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from execbox.core.errors import QueueUnavailable
from execbox.core.redis import connect
from execbox.core.sentinel import BlockingSentinelPool
from execbox.executions.queue import depth, make_queue
from execbox.executions.store import ExecutionStore
from execbox.executions.waits import ASYNC_CONNECTIONS, LISTENER_CLOSE_S, STREAM_CONNECTIONS, Waiters
from execbox.settings import Settings
from tests.conftest import PASSWORDS, Redis, free_port
from tests.unit.conftest import InProcess, make_record

SENTINELS = "sentinel://api:pw@h1:26379,h2:26380,h3:26381/execbox?db=2"
PROGRAM = {"language": "python", "code": "print(1)"}


def test_a_sentinel_setting_gives_the_sync_client_and_rq_the_primary_sentinel_names() -> None:
    client = connect(Settings(redis={"url": SENTINELS, "socket_timeout_s": 1.5}))

    pool: Any = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "execbox" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["socket_timeout"]) == (2, "api", 1.5)
    assert [s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels] == [
        26379,
        26380,
        26381,
    ]
    assert isinstance(client, redis.Redis)  # what RQ 3's Queue and Worker take as their connection


def test_a_redis_setting_still_gives_a_client_of_that_one_server() -> None:
    client = connect(Settings(redis={"url": "redis://u:p@127.0.0.1:6390/4"}))

    pool: Any = client.connection_pool
    assert not isinstance(pool, SentinelConnectionPool)
    assert (pool.connection_kwargs["host"], pool.connection_kwargs["port"], pool.connection_kwargs["db"]) == (
        "127.0.0.1",
        6390,
        4,
    )


def test_the_apis_asyncio_pools_follow_the_sentinels_and_still_make_callers_queue() -> None:
    settings = Settings(redis={"url": SENTINELS, "socket_timeout_s": 2.0}, api={"sse_keepalive_s": 15})

    async def build() -> tuple[Any, Any]:
        waiters = Waiters(settings)
        try:
            return waiters.redis.connection_pool, waiters.streams.connection_pool
        finally:
            await waiters.close()

    short, streams = asyncio.run(build())

    for pool, size in ((short, ASYNC_CONNECTIONS), (streams, STREAM_CONNECTIONS)):
        assert isinstance(pool, BlockingSentinelPool) and isinstance(pool, AsyncSentinelPool)
        assert (pool.max_connections, pool.timeout, pool.service_name) == (size, 2.0, "execbox")
    assert short.connection_kwargs["retry"].get_retries() == 8  # a fail-over is retried, not surfaced
    assert streams.connection_kwargs["socket_timeout"] == 17.0  # blocking XREADs outlast a keep-alive
    assert all(s.connection_pool.connection_kwargs["socket_timeout"] == 2.0 for s in short.sentinel_manager.sentinels)


@pytest.fixture
def settings(redis_server: Redis, tmp_path: Path) -> Settings:
    """The unit tier's settings, asking every acceptance to reach one replica within 100 ms."""
    prefix = f"u{secrets.token_hex(4)}"
    return Settings(
        redis={"url": redis_server.url, "key_prefix": prefix, "accept_replicas": 1, "accept_wait_ms": 100},
        queue={"name": prefix},
        artifacts_dir=tmp_path / "artifacts",
    )


def test_without_a_replica_the_wait_gives_up_after_its_timeout(settings: Settings, client: redis.Redis) -> None:
    store = ExecutionStore(client, settings)
    record = make_record(settings)
    store.create(record)

    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match="0 of 1 Redis replica"):
        store.replicated(record.id, 1, 100)
    assert 0.09 <= time.monotonic() - started < 2


def test_an_acceptance_no_replica_holds_is_a_retryable_503_and_its_retry_finds_the_same_execution(
    api: tuple[InProcess, dict[str, dict[str, str]]], settings: Settings, client: redis.Redis
) -> None:
    http, as_ = api
    headers = {**as_["alpha"], "Idempotency-Key": "no-replica"}

    first = http.post("/v1/executions", json=PROGRAM, headers=headers)
    retry = http.post("/v1/executions", json=PROGRAM, headers=headers)

    for answer in (first, retry):
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "service.queue_unavailable" and answer.json()["retryable"] is True
    assert depth(make_queue(client, settings)) == 1, "the retry found the first execution, made no second"


def test_by_default_an_acceptance_waits_for_no_replica() -> None:
    assert (Settings().redis.accept_replicas, Settings().redis.accept_wait_ms) == (0, 500)


def test_a_connection_reconnected_mid_command_asks_where_the_primary_is_now(
    redis_server: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry of a command whose connection died reconnects it without the pool: it must not go
    back to the old primary's address (here a closed port) but to the one the Sentinels now name
    (here the session's redis-server, standing in for them)."""
    url = f"sentinel://harness:{PASSWORDS['harness']}@127.0.0.1:1/execbox"
    client = connect(Settings(redis={"url": url, "socket_timeout_s": 2}))
    pool: Any = client.connection_pool
    monkeypatch.setattr(pool.proxy, "get_master_address", lambda: ("127.0.0.1", redis_server.port))
    connection = pool.make_connection()
    connection.host, connection.port = "127.0.0.1", free_port()  # the primary it had before a fail-over

    connection.send_command("PING")

    assert connection.read_response() == b"PONG" and connection.port == redis_server.port
    connection.disconnect()


def test_a_closing_api_does_not_wait_forever_for_a_listener_that_will_not_end(settings: Settings) -> None:
    """The wait channel's listener is cancelled when the API stops; one whose clean-up hangs (as a
    pub/sub unsubscribe over a stuck connection can) is left behind after LISTENER_CLOSE_S."""

    async def scenario() -> tuple[float, bool]:
        waiters = Waiters(settings)
        cancelled = asyncio.Event()

        async def stubborn() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                await asyncio.sleep(3600)  # a clean-up that never finishes

        waiters._listen = stubborn  # type: ignore[method-assign]
        await waiters.start()
        await asyncio.sleep(0)  # the listener runs up to its first wait
        began = asyncio.get_running_loop().time()
        await waiters.close()
        took = asyncio.get_running_loop().time() - began
        assert waiters._listener is not None
        waiters._listener.cancel()  # the test's own clean-up: a second cancel ends it
        return took, cancelled.is_set()

    took, cancelled = asyncio.run(scenario())
    assert cancelled and LISTENER_CLOSE_S <= took < LISTENER_CLOSE_S + 1, took
