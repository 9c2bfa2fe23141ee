"""Waiting for executions without a thread per waiter.

Every `?wait=` / `Prefer: wait` request of this API process shares one Redis pub/sub connection
(a pattern subscription to the deployment's `done:*` channels) and waits on an asyncio event, so a
thousand waiting clients hold a thousand small objects, not a thousand threads or connections, and
`/healthz` never queues behind them. A wait ends when the execution's done channel fires, when its
time is up, or at once when the client disconnects. After any reconnection to Redis every waiter
re-reads its record (a completion may have been published while the connection was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from execbox.core.redis import redis_errors
from execbox.core.sentinel import async_client, close_sentinels, is_sentinel_url, parse
from execbox.executions.keys import ExecutionKeys
from execbox.executions.record import ExecutionRecord
from execbox.executions.settings import ExecutionsConfig

log = logging.getLogger(__name__)
ASYNC_CONNECTIONS = 16
LISTENER_CLOSE_S = 2.0
"""How long a closing API waits for its pub/sub listener to end once cancelled: its clean-up
(unsubscribing over the connection) must not hold the process's shutdown."""
STREAM_CONNECTIONS = 256
"""Connections for live-event readers (SSE): each holds one during a blocking XREAD, so they have a
pool of their own and never queue the short reads (API keys) behind them."""
T = TypeVar("T")


def _client(url: str, connect_timeout_s: float, **pool: Any) -> aioredis.Redis:
    """A client on a blocking pool: of one server (redis://), or of the primary the Sentinels name
    (sentinel://; the pool asks them again at each new connection, so a fail-over costs the
    commands in flight a retry on a fresh connection)."""
    if is_sentinel_url(url):
        return async_client(parse(url), socket_timeout_s=connect_timeout_s, **pool)
    blocking = aioredis.BlockingConnectionPool.from_url(
        url, socket_connect_timeout=connect_timeout_s, health_check_interval=30, **pool
    )
    return aioredis.Redis(connection_pool=blocking)


class Waiters:
    def __init__(self, settings: ExecutionsConfig) -> None:
        self._keys = ExecutionKeys(settings.redis.key_prefix)
        # A few connections shared by every request of the process: a burst of reads queues for
        # one (bounded by the socket timeout) instead of opening hundreds.
        # Connections found dead (Redis restarted, or still loading its AOF) are replaced and the
        # command retried for a few seconds.
        self._redis = _client(
            settings.redis.url,
            settings.redis.socket_timeout_s,
            max_connections=ASYNC_CONNECTIONS,
            timeout=settings.redis.socket_timeout_s,
            socket_timeout=settings.redis.socket_timeout_s,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 8),  # ~5 s: a restart and its AOF replay
            retry_on_error=[RedisConnectionError, RedisTimeoutError, BusyLoadingError],
        )
        self._pool = self._redis.connection_pool
        self.streams = _client(
            settings.redis.url,
            settings.redis.socket_timeout_s,
            max_connections=STREAM_CONNECTIONS,
            timeout=settings.redis.socket_timeout_s,
            socket_timeout=settings.redis.socket_timeout_s + settings.api.sse_keepalive_s,
        )
        """The client for blocking reads of live events."""
        self._stream_pool = self.streams.connection_pool
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    @property
    def redis(self) -> aioredis.Redis:
        """The process's async Redis client (short reads on the event loop, e.g. API key lookups)."""
        return self._redis

    async def start(self) -> None:
        self._listener = asyncio.create_task(self._listen(), name="execbox-waiters")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            # Bounded: a listener whose pub/sub clean-up hangs (CI saw a shutdown wait for it until
            # the test's 120 s timeout) is left behind; the pools below are disconnected anyway.
            done, _ = await asyncio.wait({self._listener}, timeout=LISTENER_CLOSE_S)
            if not done:
                log.warning("the wait channel's listener did not end within %.0f s of closing", LISTENER_CLOSE_S)
        await self._redis.aclose()
        await self._pool.disconnect()  # a pool given to the client is not closed with it
        await self.streams.aclose()
        await self._stream_pool.disconnect()
        await close_sentinels(self._pool)
        await close_sentinels(self._stream_pool)

    async def _listen(self) -> None:
        pattern = self._keys.pattern("done")
        delay = 0.2
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.psubscribe(pattern)
                    self._subscribed.set()
                    self._wake_all()  # anything published while we were away: re-read
                    delay = 0.2
                    async for message in pubsub.listen():
                        if message.get("type") == "pmessage":
                            channel = message["channel"]
                            name = channel.decode() if isinstance(channel, bytes) else str(channel)
                            for event in self._waiting.get(name.rsplit(":", 1)[-1], ()):
                                event.set()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self._subscribed.clear()
                log.warning("wait channel lost (%s); reconnecting", exc)
                self._wake_all()
                await asyncio.sleep(delay)  # Redis is down: nothing to be told by
                delay = min(delay * 2, 5.0)

    def _wake_all(self) -> None:
        for events in self._waiting.values():
            for event in events:
                event.set()

    async def record(self, execution_id: str) -> ExecutionRecord | None:
        with redis_errors():
            raw = await self._redis.get(self._keys.execution(execution_id))
        return None if raw is None else ExecutionRecord.model_validate_json(raw)

    async def wait(
        self, execution_id: str, timeout_s: float, disconnected: Callable[[], Awaitable[None]]
    ) -> ExecutionRecord | None:
        """The execution's record once it is terminal, or its latest when timeout_s passed or the
        client went away. Reads only: settling expiries and lost workers is the sweeper's work."""
        return await self.wait_for(
            execution_id, lambda: self.record(execution_id), lambda r: r.status.terminal, timeout_s, disconnected
        )

    async def wait_for(
        self,
        name: str,
        read: Callable[[], Awaitable[T | None]],
        done: Callable[[T], bool],
        timeout_s: float,
        disconnected: Callable[[], Awaitable[None]],
    ) -> T | None:
        """`read()` once `done` holds for it, re-read whenever `<prefix>:done:<name>` is published;
        its latest value when timeout_s passed or the client went away (None: it does not exist)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        event = asyncio.Event()
        self._waiting.setdefault(name, set()).add(event)
        gone = asyncio.ensure_future(disconnected())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), max(deadline - loop.time(), 0))
            while True:
                event.clear()  # before the read: a change after it wakes the wait below
                value = await read()
                remaining = deadline - loop.time()
                if value is None or done(value) or remaining <= 0 or gone.done():
                    return value
                woken = asyncio.ensure_future(event.wait())
                await asyncio.wait({woken, gone}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            gone.cancel()
            events = self._waiting.get(name)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiting[name]


__all__ = ["Waiters"]
