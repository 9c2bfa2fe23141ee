"""Schedules in Redis: `schedule:{id}` (JSON), `schedules:{tenant}` (ids), `schedules:due`
(id -> the time it must be looked at), `firings:{id}` (the firing list) and `slot:{id}:{slot}`
(the claim that makes a slot fire once, however many schedulers run)."""

from __future__ import annotations

import json
import logging
import time

import redis
from pydantic import ValidationError

from execbox.core.readable import readable
from execbox.core.redis import redis_errors, text
from execbox.schedules.keys import ScheduleKeys
from execbox.schedules.schemas import MAX_MISFIRE_GRACE_S, Firing, Schedule

log = logging.getLogger(__name__)
FIRINGS_KEPT = 1000
CLAIM_AFTER_SLOT_S = MAX_MISFIRE_GRACE_S + 300
"""A slot's claim lapses this long after the slot: later, no scheduler can take the slot for one
to fire (past any misfire grace; a late fire_latest also carries the slot's Idempotency-Key).
With the policy's minimum interval this bounds the claims a schedule keeps."""
MIN_CLAIM_S = 60


class ScheduleStore:
    def __init__(self, client: redis.Redis, keys: ScheduleKeys) -> None:
        self.redis = client
        self.keys = keys

    def put(self, schedule: Schedule, due_at: float | None) -> None:
        raw = readable(Schedule, schedule)  # 422 and nothing stored when its reader would refuse it
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.schedule(schedule.id), raw)
            pipe.zadd(self.keys.schedules(schedule.tenant), {schedule.id: schedule.created_at})
            if due_at is None:
                pipe.zrem(self.keys.schedules_due, schedule.id)
            else:
                pipe.zadd(self.keys.schedules_due, {schedule.id: due_at})
            pipe.execute()

    def get(self, schedule_id: str) -> Schedule | None:
        with redis_errors():
            raw = self.redis.get(self.keys.schedule(schedule_id))
        return None if raw is None else Schedule.model_validate_json(raw)

    def delete(self, schedule: Schedule) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.delete(self.keys.schedule(schedule.id), self.keys.firings(schedule.id))
            pipe.zrem(self.keys.schedules(schedule.tenant), schedule.id)
            pipe.zrem(self.keys.schedules_due, schedule.id)
            pipe.execute()

    def of_tenant(self, tenant: str) -> list[Schedule]:
        with redis_errors():
            ids = [text(i) for i in self.redis.zrange(self.keys.schedules(tenant), 0, -1)]
            raws = self.redis.mget([self.keys.schedule(i) for i in ids]) if ids else []
        found: list[Schedule] = []
        for schedule_id, raw in zip(ids, raws, strict=True):
            try:
                found += [Schedule.model_validate_json(raw)] if raw is not None else []
            except ValidationError:  # stored by an older version: it must not fail the whole list
                log.warning("schedule %s cannot be read; `execbox records rm schedule` removes it", schedule_id)
        return found

    def count(self, tenant: str) -> int:
        with redis_errors():
            return int(self.redis.zcard(self.keys.schedules(tenant)))

    def remove(self, schedule_id: str) -> bool:
        """Delete a schedule, readable or not (the operator's `execbox records rm schedule`)."""
        with redis_errors():
            raw = self.redis.get(self.keys.schedule(schedule_id))
        try:
            owner = json.loads(raw).get("tenant") if raw is not None else None
        except (ValueError, AttributeError):
            owner = None  # not even JSON: its tenant's index keeps a dangling id, which lists skip
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.delete(self.keys.schedule(schedule_id), self.keys.firings(schedule_id))
            pipe.zrem(self.keys.schedules_due, schedule_id)
            if isinstance(owner, str):
                pipe.zrem(self.keys.schedules(owner), schedule_id)
            pipe.execute()
        return raw is not None

    def due(self, now: float, limit: int = 100) -> list[str]:
        with redis_errors():
            return [text(i) for i in self.redis.zrangebyscore(self.keys.schedules_due, "-inf", now, 0, limit)]

    def claim(self, schedule_id: str, slot: float, what: str = "") -> bool:
        """True for exactly one caller per (schedule, slot, what)."""
        ttl = max(int(slot + CLAIM_AFTER_SLOT_S - time.time()), MIN_CLAIM_S)
        with redis_errors():
            return bool(self.redis.set(self.keys.slot(schedule_id, f"{slot:.3f}{what}"), "1", nx=True, ex=ttl))

    def add_firing(self, schedule_id: str, firing: Firing) -> None:
        key = self.keys.firings(schedule_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(key, firing.model_dump_json())
            pipe.ltrim(key, -FIRINGS_KEPT, -1)
            pipe.execute()

    def firings(self, schedule_id: str) -> list[Firing]:
        with redis_errors():
            return [Firing.model_validate_json(raw) for raw in self.redis.lrange(self.keys.firings(schedule_id), 0, -1)]
