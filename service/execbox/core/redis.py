"""The one seam to Redis: connections, and redis-py failures translated into the service's errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import RedisError

from execbox.core.errors import QueueUnavailable
from execbox.core.settings import Settings


@contextmanager
def redis_errors() -> Iterator[None]:
    """Translate redis-py failures into the service's taxonomy at this seam."""
    try:
        yield
    except RedisError as exc:
        raise QueueUnavailable(f"Redis is unreachable or failing ({exc}); retry shortly") from exc


def text(value: object) -> str:
    """A reply (bytes from redis-py) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def connect(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
    )
