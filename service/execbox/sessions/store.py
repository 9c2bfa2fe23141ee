"""Sessions in Redis (keys under `ses:`, see execbox.sessions.keys).

A session's record changes only by compare-and-set. Its executions wait on its own list
(`ses:{id}:cells`), never on the shared queue: the worker holding the session pops them in order
and runs one at a time. A new session waits on `ses:starts:{queue}` until a worker with room takes
it. Admission takes a slot in the tenant's quota (`t:ses:open:{tenant}`) and in the fleet's
(`ses:live`, the sessions not ended, against the slots the workers report) in one step; both lose
the session in the same transaction that ends it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from execbox.core.redis import compare_and_set, redis_errors, text
from execbox.executions.schemas import ExecutionError
from execbox.executions.status import ErrorCategory
from execbox.sessions.errors import SessionEnded
from execbox.sessions.keys import SessionKeys
from execbox.sessions.ops import ANSWER_CAP, ANSWER_TTL_S
from execbox.sessions.record import SessionRecord
from execbox.sessions.status import SessionEnd, SessionStatus
from execbox.tenancy.errors import RateLimited

WAKE = "wake"
"""Pushed on a session's list to wake its holder (it re-reads the record)."""
_OPEN = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 'ok' end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 'tenant' end
if tonumber(ARGV[4]) >= 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 'fleet' end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 'ok'
"""


ASK_CAP = 256
"""Requests waiting for a session's holder (`ses:{id}:asks`); past it, or ASK_BYTES, the asker gets 429."""
ASK_BYTES = 32 << 20
ANSWER_BYTES = 32 << 20
"""Bytes an answer list may hold (a whole read of E2B's default 16 MiB largest file, in base64, fits);
past it nothing more is added but a short last word (SMALL_ANSWER, within ANSWER_SLACK), and the holder
is told the list is full (`FULL`), as for ANSWER_CAP entries."""
SMALL_ANSWER = 512
ANSWER_SLACK = 64 << 10
FULL = ANSWER_CAP + 1
"""What `answer` returns when it did not add the answer: above the entry cap, so the holder stops."""

# A list's bytes are counted in the session's `ses:{id}:bytes` hash (field: the list's name) from the
# moment it was last empty: a reader that catches up resets it, so it bounds what waits without the
# readers having to count what they take (never less than what waits, sometimes more).
_PUSH = """
if ARGV[5] == '1' then
  local raw = redis.call('GET', KEYS[3])
  if raw and cjson.decode(raw).status == 'ended' then return -1 end
end
local waiting = redis.call('LLEN', KEYS[1])
local held = 0
if waiting > 0 then held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0') end
local size = string.len(ARGV[1])
if waiting >= tonumber(ARGV[3]) or held + size > tonumber(ARGV[4]) then return -2 end
waiting = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[2], held + size)
redis.call('EXPIRE', KEYS[1], ARGV[6])
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[6]) then redis.call('EXPIRE', KEYS[2], ARGV[6]) end
return waiting
"""


class SessionStore:
    def __init__(self, client: redis.Redis, keys: SessionKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.retention_s = retention_s
        self._push = client.register_script(_PUSH)

    def _bounded_push(
        self, session_id: str, key: str, field: str, item: str, entries: int, nbytes: int, ttl_s: int, live: bool
    ) -> int:
        """RPUSH under the list's caps: the entries now waiting, -1 (the session's record says it ended:
        `live` asks that it has not), -2 (a cap would be passed; nothing added)."""
        keys = [key, self.keys.session_bytes(session_id), self.keys.session(session_id)]
        with redis_errors():
            return int(self._push(keys=keys, args=[item, field, entries, nbytes, int(live), ttl_s]))

    def admit(self, tenant: str, session_id: str, limit: int, fleet: int | None = None) -> str:
        """Take one of the tenant's `limit` open-session slots and one of the fleet's `fleet` (None:
        not known, not counted), atomically: "ok", or what is full ("tenant" | "fleet", nothing taken)."""
        with redis_errors():
            script = self.redis.register_script(_OPEN)
            keys = [self.keys.open_sessions(tenant), self.keys.live_sessions]
            return text(script(keys=keys, args=[session_id, limit, time.time(), -1 if fleet is None else fleet]))

    def release(self, tenant: str, session_id: str) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.zrem(self.keys.open_sessions(tenant), session_id)
            pipe.zrem(self.keys.live_sessions, session_id)
            pipe.execute()

    def forget(self, session_id: str, older_than_s: float) -> bool:
        """Give back the fleet's slot of a session admitted but never stored (its API stopped between
        the two), once its admission is older than older_than_s; True when it was given back."""
        with redis_errors():
            admitted = self.redis.zscore(self.keys.live_sessions, session_id)
            if admitted is None or admitted > time.time() - older_than_s:
                return False
            if self.redis.exists(self.keys.session(session_id)):
                return False
            return bool(self.redis.zrem(self.keys.live_sessions, session_id))

    def create(self, record: SessionRecord, queue: str) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.session(record.id), record.model_dump_json(), ex=self.retention_s)
            pipe.zadd(self.keys.sessions_of(record.tenant), {record.id: record.created_at})
            pipe.zadd(self.keys.live_sessions, {record.id: record.created_at})
            pipe.rpush(self.keys.session_starts(queue), record.id)
            pipe.execute()

    def get(self, session_id: str) -> SessionRecord | None:
        with redis_errors():
            raw = self.redis.get(self.keys.session(session_id))
        return None if raw is None else SessionRecord.model_validate_json(raw)

    def of_tenant(self, tenant: str, limit: int = 100) -> list[SessionRecord]:
        with redis_errors():
            ids = [text(i) for i in self.redis.zrevrange(self.keys.sessions_of(tenant), 0, limit - 1)]
            raws = self.redis.mget([self.keys.session(i) for i in ids]) if ids else []
        return [SessionRecord.model_validate_json(raw) for raw in raws if raw is not None]

    def live(self) -> list[str]:
        with redis_errors():
            return [text(i) for i in self.redis.zrange(self.keys.live_sessions, 0, -1)]

    def update(self, session_id: str, mutate: Callable[[SessionRecord], bool]) -> SessionRecord | None:
        """Change a session that has not ended; `mutate` returns False to leave it as it is."""

        def change(record: SessionRecord, pipe: redis.client.Pipeline) -> bool:
            if record.status is SessionStatus.ENDED or not mutate(record):
                return False
            ended = record.status == SessionStatus.ENDED  # type: ignore[comparison-overlap]  # mutate may end it
            if ended:
                record.ended_at = record.ended_at or time.time()
            pipe.set(self.keys.session(record.id), record.model_dump_json(), ex=self.retention_s)
            if ended:
                pipe.zrem(self.keys.open_sessions(record.tenant), record.id)
                pipe.zrem(self.keys.live_sessions, record.id)
                # What the session owns goes with it: its requests now; its queue once the holder has been
                # woken (it drains it) or within ANSWER_TTL_S, as its answer lists ("gone" is the last).
                pipe.delete(self.keys.session_lease(record.id), self.keys.session_ops(record.id),
                            self.keys.session_bytes(record.id))  # fmt: skip
                pipe.rpush(self.keys.session_cells(record.id), WAKE)
                pipe.expire(self.keys.session_cells(record.id), ANSWER_TTL_S)
            return True

        return compare_and_set(self.redis, self.keys.session(session_id), SessionRecord.model_validate_json, change)

    def end(
        self,
        session_id: str,
        reason: SessionEnd,
        why: str | None = None,
        worker: str | None = None,
        unclaimed: bool = False,
    ) -> SessionRecord | None:
        """End a session that has not ended (None when it had, or is gone); `why` (something
        failed) becomes its sandbox.error. With `worker`, only while that worker still holds it;
        with `unclaimed`, only while no worker has taken it."""
        error = None
        if why is not None:
            error = ExecutionError(
                category=ErrorCategory.SANDBOX_ERROR, message=f"the session ended: {why}", retryable=False
            )

        def mutate(record: SessionRecord) -> bool:
            if (worker is not None and record.worker != worker) or (unclaimed and record.worker is not None):
                return False
            record.status, record.end_reason, record.error = SessionStatus.ENDED, reason, error
            return True

        return self.update(session_id, mutate)

    # the queue of a session's executions
    def push(self, session_id: str, execution_id: str) -> None:
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(self.keys.session_cells(session_id), execution_id)
            pipe.expire(self.keys.session_cells(session_id), self.retention_s)
            pipe.execute()

    def pop(self, session_id: str, timeout_s: float) -> str | None:
        """The next execution id (or WAKE), waiting up to timeout_s; None when nothing came."""
        with redis_errors():
            got = self.redis.blpop([self.keys.session_cells(session_id)], timeout=max(timeout_s, 0.01))
        return None if got is None else text(got[1])

    def wake(self, session_id: str) -> None:
        """End the holder's wait for a next call now (its worker is stopping)."""
        with redis_errors():
            self.redis.rpush(self.keys.session_cells(session_id), WAKE)

    def drain(self, session_id: str) -> list[str]:
        """Every execution id still waiting (the session ended; they will not run)."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.lrange(self.keys.session_cells(session_id), 0, -1)
            pipe.delete(self.keys.session_cells(session_id))
            waiting, _ = pipe.execute()
        return [text(i) for i in waiting if text(i) != WAKE]

    # file and process requests beside the cells (execbox.sessions.ops)
    def ask(self, session_id: str, request: str) -> None:
        """Queue a request for the holder; SessionEnded when the session ended, RateLimited (429) when
        ASK_CAP requests or ASK_BYTES wait already."""
        key = self.keys.session_ops(session_id)
        done = self._bounded_push(session_id, key, "asks", request, ASK_CAP, ASK_BYTES, self.retention_s, live=True)
        if done == -1:
            raise SessionEnded(f"session {session_id} ended; its sandbox takes no more requests")
        if done == -2:
            raise RateLimited(
                f"session {session_id} has {ASK_CAP} requests or {ASK_BYTES} bytes waiting for its sandbox, its "
                "limit; wait for answers to come back, then retry",
                headers={"Retry-After": "1"},
            )

    def next_op(self, session_id: str, timeout_s: float) -> str | None:
        with redis_errors():
            got = self.redis.blpop([self.keys.session_ops(session_id)], timeout=max(timeout_s, 0.01))
        return None if got is None else text(got[1])

    def answer(self, session_id: str, op: str, answer: str, ttl_s: int) -> int:
        """Add to a request's answers; how many are now waiting to be read, or FULL (not added) when the
        list holds ANSWER_BYTES (a short answer, such as the last "dropped", has ANSWER_SLACK more)."""
        key = self.keys.session_answers(session_id, op)
        cap = ANSWER_BYTES + (ANSWER_SLACK if len(answer) <= SMALL_ANSWER else 0)
        waiting = self._bounded_push(session_id, key, f"answers:{op}", answer, FULL, cap, ttl_s, live=False)
        return FULL if waiting < 0 else waiting

    def next_start(self, queue: str, timeout_s: float) -> str | None:
        with redis_errors():
            got = self.redis.blpop([self.keys.session_starts(queue)], timeout=max(timeout_s, 0.01))
        return None if got is None else text(got[1])

    # the holder's lease
    def renew_lease(self, session_id: str, worker: str, lease_s: float) -> None:
        with redis_errors():
            self.redis.set(self.keys.session_lease(session_id), worker, px=int(lease_s * 1000))

    def lease_alive(self, session_id: str) -> bool:
        with redis_errors():
            return bool(self.redis.exists(self.keys.session_lease(session_id)))
