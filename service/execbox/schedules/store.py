"""Schedules in Redis: `schedule:{id}` (JSON), `schedules:{tenant}` (ids), `schedules:due`
(id -> the time it must be looked at), `firings:{id}` (the firing list) and `slot:{id}:{slot}`
(the claim that makes a slot fire once, however many schedulers run)."""

from __future__ import annotations

import redis

from execbox.core.keys import Keys
from execbox.core.redis import redis_errors, text
from execbox.schedules.schemas import Firing, Schedule

FIRINGS_KEPT = 1000
CLAIM_S = 7 * 86400


class ScheduleStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    def put(self, schedule: Schedule, due_at: float | None) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.schedule(schedule.id), schedule.model_dump_json())
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
        return [Schedule.model_validate_json(raw) for raw in raws if raw is not None]

    def due(self, now: float, limit: int = 100) -> list[str]:
        with redis_errors():
            return [text(i) for i in self.redis.zrangebyscore(self.keys.schedules_due, "-inf", now, 0, limit)]

    def claim(self, schedule_id: str, slot: float, what: str = "") -> bool:
        """True for exactly one caller per (schedule, slot, what)."""
        with redis_errors():
            return bool(self.redis.set(self.keys.slot(schedule_id, f"{slot:.3f}{what}"), "1", nx=True, ex=CLAIM_S))

    def add_firing(self, schedule_id: str, firing: Firing) -> None:
        key = self.keys.firings(schedule_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(key, firing.model_dump_json())
            pipe.ltrim(key, -FIRINGS_KEPT, -1)
            pipe.execute()

    def firings(self, schedule_id: str) -> list[Firing]:
        with redis_errors():
            return [Firing.model_validate_json(raw) for raw in self.redis.lrange(self.keys.firings(schedule_id), 0, -1)]
