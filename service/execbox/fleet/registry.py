"""Worker heartbeats (key `worker:{name}`): written by each worker, read by the API's health
check, its admission (which runtimes are on offer, how many session slots the fleet has), the
metrics of shared state and the per-node view (execbox.fleet.nodes).

A heartbeat is read by processes of other versions during a rolling upgrade: a field it lacks
takes its default, and a field this version does not know is ignored."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any

import redis

from execbox.core.redis import redis_errors
from execbox.fleet.keys import FleetKeys


@dataclass(frozen=True)
class Heartbeat:
    name: str
    docker_ok: bool
    detail: str = ""
    missing_images: list[str] = field(default_factory=list)
    runtimes: list[str] = field(default_factory=list)
    warm: int = 0
    """Warm containers waiting in the worker's pool."""
    session_slots: int | None = None
    """Sessions the worker may hold at once (EXECBOX_SESSIONS__PER_WORKER); None from a worker that does not say."""
    queue: str = ""
    """The queue it serves ("" from a worker that does not say): only its queue's sessions can use its slots."""
    node: str = ""
    """The node (host) it runs on, EXECBOX_WORKER__NODE ("" from a worker that does not say)."""
    draining: bool = False
    """Its node was drained when it last looked: it finishes what it runs and takes nothing new."""
    at: float = 0.0


class WorkerRegistry:
    def __init__(self, client: redis.Redis, keys: FleetKeys) -> None:
        self.redis = client
        self.keys = keys

    def report(self, beat: Heartbeat, ttl_s: float) -> None:
        payload = json.dumps({**beat.__dict__, "at": time.time()})
        with redis_errors():
            self.redis.set(self.keys.worker(beat.name), payload, px=int(ttl_s * 1000))

    def alive(self) -> list[Heartbeat]:
        with redis_errors():
            keys = list(self.redis.scan_iter(match=self.keys.pattern("worker"), count=100))
            values = self.redis.mget(keys) if keys else []
        beats: list[dict[str, Any]] = [json.loads(v) for v in values if v is not None]
        return [read_heartbeat(beat) for beat in beats]

    def runtimes(self) -> set[str] | None:
        """The runtimes some healthy worker offers; None when no worker is healthy (nothing to say yet)."""
        live = [beat for beat in self.alive() if beat.docker_ok]
        return {runtime for beat in live for runtime in beat.runtimes} if live else None

    def session_capacity(self, queue: str) -> int | None:
        """Sessions the healthy workers of `queue` may hold together; None when that is not known (no
        healthy worker of it yet, or one that does not report its slots). A deployment's workers of
        other queues (a second API on a queue of its own) cannot hold this queue's sessions."""
        live = [beat for beat in self.alive() if beat.docker_ok and beat.queue == queue]
        if not live or any(beat.session_slots is None for beat in live):
            return None
        return sum(int(beat.session_slots or 0) for beat in live)


_FIELDS = frozenset(f.name for f in fields(Heartbeat))


def read_heartbeat(stored: dict[str, Any]) -> Heartbeat:
    """A heartbeat as any version wrote it: missing fields take their defaults, unknown ones are dropped."""
    return Heartbeat(**{name: value for name, value in stored.items() if name in _FIELDS})
