"""Runs and approvals in Redis (keys `run:*`, `runlock:*`, `runs:*`, `approval:*`, `approvals:*`).

Every change to a run happens under the run's lock (redis-py's Lock: a token with a lease), so
advancing a run is serialised across every API process; the lock is what makes "each step attempt
is dispatched at most once" hold together with the idempotency key of each dispatch. A holder
whose lease lapsed (it stalled past LOCK_S) stores nothing: `put` commits only while the lock still
holds its token (WATCH on the lock's key), else RunBusy, so a later holder's change is never lost.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import redis
from pydantic import ValidationError
from redis.exceptions import LockError, WatchError

from execbox.core.readable import readable
from execbox.core.redis import redis_errors, text
from execbox.core.streams import EventStream
from execbox.plans.errors import RunBusy
from execbox.plans.keys import PlanKeys
from execbox.plans.schemas import ApprovalPublic, StoredRun

M = TypeVar("M", StoredRun, ApprovalPublic)

log = logging.getLogger(__name__)
LOCK_S = 10.0
"""A run's lock lapses this long after its holder died (advancing a run takes milliseconds)."""
LOCK_WAIT_S = 5.0


def new_id(prefix: str) -> str:
    return prefix + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


class RunStore:
    def __init__(self, client: redis.Redis, keys: PlanKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self._retention_s = retention_s
        self.events = EventStream(client, keys.events)
        self._held = threading.local()
        """This thread's locks: run id -> the token its lock holds."""

    @contextmanager
    def locked(self, run_id: str) -> Iterator[None]:
        lock = self.redis.lock(self.keys.run_lock(run_id), timeout=LOCK_S, blocking_timeout=LOCK_WAIT_S)
        with redis_errors():
            acquired = lock.acquire()
        if not acquired:
            raise RunBusy(run_id)
        held: dict[str, bytes] = self._held.__dict__.setdefault("tokens", {})
        held[run_id] = lock.local.token
        try:
            yield
        finally:
            held.pop(run_id, None)
            try:
                lock.release()
            except LockError:
                pass  # it lapsed (a stall longer than LOCK_S); the next holder re-reads the run

    def create(self, record: StoredRun) -> None:
        raw = readable(StoredRun, _once(record))  # 422 and nothing stored when its reader would refuse it
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.run(record.id), raw, ex=self._retention_s, nx=True)
            pipe.zadd(self.keys.runs(record.tenant), {record.id: record.created_at})
            pipe.zadd(self.keys.active_runs, {record.id: 0})
            pipe.execute()

    def get(self, run_id: str) -> StoredRun | None:
        with redis_errors():
            raw = self.redis.get(self.keys.run(run_id))
        return None if raw is None else _whole(StoredRun.model_validate_json(raw))

    def put(self, record: StoredRun, due_at: float | None) -> None:
        """Store a changed run (under its lock); due_at: when it must be advanced again even if no
        execution ends (a retry, an approval's expiry, the wall budget), None when it is terminal.
        Its webhook's events go to the outbox in the same transaction. A change its reader would
        refuse is not stored (InvalidRequest, 422): the run stays as it was."""
        raw = readable(StoredRun, _once(record))
        token = self._held.__dict__.get("tokens", {}).get(record.id)
        with redis_errors(), self.redis.pipeline() as pipe:
            if token is not None:  # fenced: only while this thread's lock still holds the run
                lock_key = self.keys.run_lock(record.id)
                pipe.watch(lock_key)  # type: ignore[no-untyped-call]
                if pipe.get(lock_key) != token:
                    raise RunBusy(record.id)
                pipe.multi()
            pipe.set(self.keys.run(record.id), raw, ex=self._retention_s)
            for notice in record.take_notices():
                self.events.append(pipe, notice)
            if due_at is None:
                pipe.zrem(self.keys.active_runs, record.id)
            else:
                pipe.zadd(self.keys.active_runs, {record.id: due_at})
            pipe.publish(self.keys.done(record.id), record.status.value)
            try:
                pipe.execute()
            except WatchError as exc:  # the lease lapsed and another holder took the lock meanwhile
                raise RunBusy(record.id) from exc

    def due_now(self, run_id: str) -> None:
        """Make an active run due now (a run no longer active is left so)."""
        with redis_errors():
            self.redis.zadd(self.keys.active_runs, {run_id: time.time()}, xx=True)

    def due(self, limit: int = 64) -> list[str]:
        with redis_errors():
            return [text(m) for m in self.redis.zrangebyscore(self.keys.active_runs, "-inf", time.time(), 0, limit)]

    def of_tenant(self, tenant: str, limit: int = 100) -> list[StoredRun]:
        with redis_errors():
            ids = [text(i) for i in self.redis.zrevrange(self.keys.runs(tenant), 0, limit - 1)]
            raws = self.redis.mget([self.keys.run(i) for i in ids]) if ids else []
        found = (_readable(StoredRun, i, raw) for i, raw in zip(ids, raws, strict=True))
        return [_whole(r) for r in found if r is not None]

    def remove(self, run_id: str) -> bool:
        """Delete a run, readable or not, with its index entries and its approvals (the operator's
        `execbox records rm run`); False when there was none."""
        with redis_errors():
            raw = self.redis.get(self.keys.run(run_id))
        tenant, approvals = _loose(raw)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.delete(self.keys.run(run_id), self.keys.run_lock(run_id))
            pipe.zrem(self.keys.active_runs, run_id)
            if tenant:
                pipe.zrem(self.keys.runs(tenant), run_id)
                for approval_id in approvals:
                    pipe.delete(self.keys.approval(approval_id))
                    pipe.zrem(self.keys.approvals(tenant), approval_id)
            pipe.execute()
        return raw is not None

    # -- approvals ----------------------------------------------------------------------------

    def put_approval(self, approval: ApprovalPublic) -> None:
        raw = readable(ApprovalPublic, approval)
        with redis_errors(), self.redis.pipeline() as pipe:
            # Kept past its expiry by the retention (an approval may wait up to 30 days).
            ttl = max(self._retention_s, int(approval.expires_at - time.time()) + self._retention_s)
            pipe.set(self.keys.approval(approval.id), raw, ex=ttl)
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
        found = (_readable(ApprovalPublic, i, raw) for i, raw in zip(ids, raws, strict=True))
        return [a for a in found if a is not None]


def _once(run: StoredRun) -> StoredRun:
    """The run as stored: its inputs once, as `inputs` (the plan's copy left out; `_whole` puts it back)."""
    if not run.plan.inputs:
        return run
    return run.model_copy(update={"plan": run.plan.model_copy(update={"inputs": {}})})


def _whole(run: StoredRun) -> StoredRun:
    """The run as read: the plan's inputs are the run's (a run stored before `_once` holds both already)."""
    if run.inputs and not run.plan.inputs:
        run.plan = run.plan.model_copy(update={"inputs": dict(run.inputs)})
    return run


def _readable(model: type[M], record_id: str, raw: bytes | str | None) -> M | None:
    """A listed record, or None when it is gone or cannot be read: one broken record (stored by an
    older version) must not fail its tenant's whole list."""
    if raw is None:
        return None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        log.warning("%s %s cannot be read (%d problem(s)); `execbox records rm` removes it",
                    model.__name__, record_id, exc.error_count())  # fmt: skip
        return None


def _loose(raw: bytes | str | None) -> tuple[str | None, list[str]]:
    """The owner and approval ids of a stored run, read without its model (it may not pass it)."""
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        return None, []
    if not isinstance(data, dict):
        return None, []
    tenant = data.get("tenant")
    steps = data.get("steps")
    states = steps.values() if isinstance(steps, dict) else []
    approvals = [s["approval_id"] for s in states if isinstance(s, dict) and isinstance(s.get("approval_id"), str)]
    return (tenant if isinstance(tenant, str) else None), approvals
