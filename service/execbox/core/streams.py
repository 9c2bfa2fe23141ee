"""The durable event path: an outbox stream read by consumer groups, and a set of delayed work.

A status change appends its event in its own transaction (`EventStream.append` on the change's
pipeline), so no consumer can miss it whichever process dies when. Consumers (webhook delivery;
later plan steps and schedules) each read the stream as a consumer group: an entry a consumer took
and did not acknowledge is claimed by another after `idle_s`. Work that must wait (a retry) goes on
a `DueSet` and is taken by exactly one caller once due. The loops that read them run under
`execbox.core.poison` (one entry that fails is retried, then set aside; the loop goes on).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from execbox.core.redis import redis_errors, text

EVENTS_MAXLEN = 100_000
"""The event stream keeps about this many entries (consumers keep up within seconds)."""
TERMINAL = "execution.terminal"
"""An execution reached a terminal status; fields: id, status."""


class EventStream:
    def __init__(self, client: redis.Redis, key: str) -> None:
        self.redis = client
        self.key = key

    def append(self, pipe: redis.client.Pipeline, event: dict[str, str]) -> None:
        """Queue the event on a transaction's pipeline: written if and only if the transaction is."""
        pipe.xadd(self.key, event, maxlen=EVENTS_MAXLEN, approximate=True)  # type: ignore[arg-type]

    def ensure_group(self, group: str) -> None:
        with redis_errors():
            try:
                self.redis.xgroup_create(self.key, group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read(self, group: str, consumer: str, block_s: float, idle_s: float) -> list[tuple[str, dict[str, str]]]:
        """Events for this consumer: first those a dead consumer left pending for idle_s, then new ones."""
        with redis_errors():
            reply: Any = self.redis.xautoclaim(self.key, group, consumer, int(idle_s * 1000), count=16)
            entries = list(reply[1] or [])
            if not entries:
                got: Any = self.redis.xreadgroup(group, consumer, {self.key: ">"}, count=16,
                                                 block=max(int(block_s * 1000), 1))  # fmt: skip
                entries = [entry for _, stream_entries in got or [] for entry in stream_entries]
        return [(text(i), {text(k): text(v) for k, v in fields.items()}) for i, fields in entries if fields]

    def ack(self, group: str, event_id: str) -> None:
        with redis_errors():
            self.redis.xack(self.key, group, event_id)


class DueSet:
    """Members that become due at a time; each is taken by exactly one caller (the one whose ZREM removed it)."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.redis = client
        self.key = key

    def schedule(self, member: str, at: float) -> None:
        with redis_errors():
            self.redis.zadd(self.key, {member: at})

    def take_due(self, limit: int = 16) -> list[str]:
        with redis_errors():
            due = [text(m) for m in self.redis.zrangebyscore(self.key, "-inf", time.time(), start=0, num=limit)]
            return [m for m in due if self.redis.zrem(self.key, m)]
