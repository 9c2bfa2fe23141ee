"""The one seam to Redis: connections, and redis-py failures translated into the service's errors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import redis
from redis.exceptions import RedisError, WatchError

from execbox.core.errors import QueueUnavailable
from execbox.core.sentinel import is_sentinel_url, parse, sync_client
from execbox.core.settings import HasRedis


@contextmanager
def redis_errors() -> Iterator[None]:
    """Translate redis-py failures into the service's taxonomy at this seam."""
    try:
        yield
    except RedisError as exc:
        raise QueueUnavailable(f"Redis is unreachable or failing ({exc}); retry shortly") from exc


T = TypeVar("T")
log = logging.getLogger(__name__)


def compare_and_set(
    client: redis.Redis, key: str, parse: Callable[[bytes | str], T], change: Callable[[T, redis.client.Pipeline], bool]
) -> T | None:
    """Read key, let `change` queue its writes on a MULTI pipeline, and commit only if nobody wrote
    key in between (WATCH); retried until it commits. None when key is missing or `change` declines."""
    with redis_errors(), client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                raw = pipe.get(key)
                if raw is None:
                    return None
                value = parse(raw)
                pipe.multi()
                if not change(value, pipe):
                    pipe.reset()
                    return None
                pipe.execute()
                return value
            except WatchError:
                continue


def text(value: object) -> str:
    """A reply (bytes from redis-py) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def connect(settings: HasRedis) -> redis.Redis:
    """The process's client: of one server for a redis:// setting, of whichever node the Sentinels
    name the primary for a sentinel:// one (RQ takes it too: it is a plain redis.Redis)."""
    if is_sentinel_url(settings.redis.url):
        return sync_client(parse(settings.redis.url), socket_timeout_s=settings.redis.socket_timeout_s)
    return redis.Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
    )


def through_outage(what: str, step: Callable[[], T], patience_s: float) -> T:
    """`step` (which needs Redis), tried again while Redis answers QueueUnavailable (a Sentinel
    fail-over leaves it without a primary for a few seconds), 0.2 s doubling to 2 s apart; past
    `patience_s` the error stands. For steps that must not be given up lightly, such as storing a
    finished run's outcome, which the reaper would otherwise call lost."""
    deadline = time.monotonic() + patience_s
    delay = 0.2
    while True:
        try:
            return step()
        except QueueUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: %s; trying again in %.1f s", what, exc.message, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
