"""Runs and approvals in Redis (keys `run:*`, `runlock:*`, `runs:*`, `approval:*`, `approvals:*`).

Every change to a run happens under the run's lock (redis-py's Lock: a token with a lease), so
advancing a run is serialised across every API process; the lock is what makes "each step attempt
is dispatched at most once" hold together with the idempotency key of each dispatch.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError

from execbox.core.errors import RunBusy
from execbox.core.events import EventStream
from execbox.core.keys import Keys
from execbox.core.redis import redis_errors, text
from execbox.plans.schemas import ApprovalPublic, RunRecord

LOCK_S = 10.0
"""A run's lock lapses this long after its holder died (advancing a run takes milliseconds)."""
LOCK_WAIT_S = 5.0


def new_id(prefix: str) -> str:
    return prefix + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


class RunStore:
    def __init__(self, client: redis.Redis, keys: Keys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self._retention_s = retention_s
        self.events = EventStream(client, keys.events)

    @contextmanager
    def locked(self, run_id: str) -> Iterator[None]:
        lock = self.redis.lock(self.keys.run_lock(run_id), timeout=LOCK_S, blocking_timeout=LOCK_WAIT_S)
        with redis_errors():
            acquired = lock.acquire()
        if not acquired:
            raise RunBusy(run_id)
        try:
            yield
        finally:
            try:
                lock.release()
            except LockError:
                pass  # it lapsed (a stall longer than LOCK_S); the next holder re-reads the run

    def create(self, record: RunRecord) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.run(record.id), record.model_dump_json(), ex=self._retention_s, nx=True)
            pipe.zadd(self.keys.runs(record.tenant), {record.id: record.created_at})
            pipe.zadd(self.keys.active_runs, {record.id: 0})
            pipe.execute()

    def get(self, run_id: str) -> RunRecord | None:
        with redis_errors():
            raw = self.redis.get(self.keys.run(run_id))
        return None if raw is None else RunRecord.model_validate_json(raw)

    def put(self, record: RunRecord, due_at: float | None) -> None:
        """Store a changed run (under its lock); due_at: when it must be advanced again even if no
        execution ends (a retry, an approval's expiry, the wall budget), None when it is terminal.
        Its webhook's events go to the outbox in the same transaction."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.run(record.id), record.model_dump_json(), ex=self._retention_s)
            for notice in record.take_notices():
                self.events.append(pipe, notice)
            if due_at is None:
                pipe.zrem(self.keys.active_runs, record.id)
            else:
                pipe.zadd(self.keys.active_runs, {record.id: due_at})
            pipe.publish(self.keys.done(record.id), record.status.value)
            pipe.execute()

    def due(self, limit: int = 64) -> list[str]:
        with redis_errors():
            return [text(m) for m in self.redis.zrangebyscore(self.keys.active_runs, "-inf", time.time(), 0, limit)]

    def of_tenant(self, tenant: str, limit: int = 100) -> list[RunRecord]:
        with redis_errors():
            ids = [text(i) for i in self.redis.zrevrange(self.keys.runs(tenant), 0, limit - 1)]
            raws = self.redis.mget([self.keys.run(i) for i in ids]) if ids else []
        return [RunRecord.model_validate_json(raw) for raw in raws if raw is not None]

    # -- approvals ----------------------------------------------------------------------------

    def put_approval(self, approval: ApprovalPublic) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.approval(approval.id), approval.model_dump_json(), ex=self._retention_s)
            pipe.zadd(self.keys.approvals(approval.tenant), {approval.id: approval.requested_at})
            pipe.execute()

    def approval(self, approval_id: str) -> ApprovalPublic | None:
        with redis_errors():
            raw = self.redis.get(self.keys.approval(approval_id))
        return None if raw is None else ApprovalPublic.model_validate_json(raw)

    def approvals(self, tenant: str, limit: int = 100) -> list[ApprovalPublic]:
        with redis_errors():
            ids = [text(i) for i in self.redis.zrevrange(self.keys.approvals(tenant), 0, limit - 1)]
            raws = self.redis.mget([self.keys.approval(i) for i in ids]) if ids else []
        return [ApprovalPublic.model_validate_json(raw) for raw in raws if raw is not None]
