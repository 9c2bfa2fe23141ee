"""The job queue (RQ on Redis) and its fair dispatch: the only module that puts work on RQ.

Other modules import rq, none of them to queue anything: the RQ worker that takes tickets
(`worker/main.py`) and its job gate (`worker/gate.py`), and three that name rq's `Queue` only as
the type of the queue this module makes and hands them (`assembly.py`, `api/__init__.py`,
`api/deps.py`, `executions/submit.py`). A new use of rq belongs here (tests/unit/test_docs.py keeps this list
true).

Scheduling is fair across tenants. An accepted execution goes to the end of its tenant's own
pending list, and one interchangeable *ticket* job goes on the shared RQ queue, in the same Redis
transaction. A worker that takes a ticket asks for the next execution round-robin over the
tenants that have work waiting: one tenant queueing a thousand executions delays another tenant's
next one by at most one execution per busy worker, not by the thousand. Within a tenant, order is
first-in, first-out. There is a ticket for every entry; a ticket that finds a cancelled or
expired entry skips it and takes the next, so no runnable entry is ever left without one.

A ticket can still be lost outside this module: RQ moves a job to its intermediate list before the
worker marks itself busy, and a worker stopped (or killed) in that instant leaves the job there
(RQ later fails it as stuck) while the entry it stood for waits with no ticket. `restore_tickets`,
run by every worker's reaper, puts back one ticket for each entry beyond the tickets waiting. A
spare ticket costs one empty take ("nothing to run"); a missing one leaves an execution queued
until it expires.

An entry can be lost too, and so is never simply popped. The take moves it, in the same script,
to the queue's *taken* set (stamped with the worker's clock), and the worker drops it from there once
the record says running (`taken`). Between the two, a Sentinel fail-over can lose what the worker
did: the pop reached the replica that is promoted, the worker's move to running did not (or its
reply never came), and the record stays queued with no entry. `return_lost_takes`, also run by
every reaper, puts back each entry taken longer ago than a grace whose record is still queued (and
drops the rest). An entry put back twice, or whose worker was only slow, does nothing: a take
moves a record only out of queued. So the hosts' clocks need not agree: one behind the reaper's
puts an entry back early (a spare), one ahead puts it back late.

The record in the store stays the single source of truth, so a stale entry does nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from execbox.core.redis import redis_errors
from execbox.executions.keys import ExecutionKeys
from execbox.executions.record import ExecutionRecord
from execbox.executions.settings import ExecutionsConfig
from execbox.executions.status import ExecutionStatus

log = logging.getLogger(__name__)
TASK = "execbox.worker.tasks.run_next"
JOB_FUNCTIONS = frozenset({TASK})
"""The only functions a worker runs from the queue (RQ would import any dotted path it is given)."""


def make_queue(client: redis.Redis, settings: ExecutionsConfig) -> Queue:
    return Queue(settings.queue.name, connection=client, serializer=JSONSerializer)


# Keys, under <prefix>:q:<queue>: pending:<tenant> (JSON entries, oldest first), ring (tenants with
# work, in turn order), ring:members (the same tenants as a set, so each is in the ring once) and
# taken (entries a worker took and has not yet seen running, scored by when).
_PUSH = """
redis.call('RPUSH', KEYS[3], ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then redis.call('RPUSH', KEYS[1], ARGV[1]) end
"""
_PUT_BACK = """
if redis.call('ZREM', KEYS[4], ARGV[2]) == 0 then return 0 end
redis.call('LPUSH', KEYS[3], ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then redis.call('RPUSH', KEYS[1], ARGV[1]) end
return 1
"""
_TAKE = """
for _ = 1, redis.call('LLEN', KEYS[1]) do
  local tenant = redis.call('LPOP', KEYS[1])
  local pending = ARGV[1] .. tenant
  local entry = redis.call('LPOP', pending)
  if redis.call('LLEN', pending) > 0 then
    redis.call('RPUSH', KEYS[1], tenant)
  else
    redis.call('SREM', KEYS[2], tenant)
  end
  if entry then
    redis.call('ZADD', KEYS[3], ARGV[2], entry)
    return entry
  end
end
return false
"""


@dataclass(frozen=True)
class QueueEntry:
    """What a ticket hands its worker: the execution to start and the trace context to join."""

    execution_id: str
    traceparent: str | None
    raw: str
    """The entry as queued: its name in the taken set."""


def _keys(settings: ExecutionsConfig) -> tuple[str, str, str]:
    return ExecutionKeys(settings.redis.key_prefix).queue(
        settings.queue.name
    )  # a queue's tickets serve its own entries


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _taken_key(settings: ExecutionsConfig) -> str:
    return ExecutionKeys(settings.redis.key_prefix).taken(settings.queue.name)


def _ticket(
    queue: Queue, settings: ExecutionsConfig, backstop_s: int, description: str, pipe: redis.client.Pipeline
) -> None:
    queue.enqueue_call(
        TASK,
        args=({},),
        timeout=backstop_s + settings.queue.setup_margin_s,
        result_ttl=60,
        failure_ttl=settings.retention_s,
        description=description,
        pipeline=pipe,
    )


def enqueue(
    queue: Queue, record: ExecutionRecord, traceparent: str, settings: ExecutionsConfig, backstop_s: int
) -> None:
    """Queue an execution: its entry on its tenant's list and a ticket on the RQ queue, atomically.

    `backstop_s` is RQ's own job timeout, a last resort above the longest run any policy allows
    (the sandbox enforces each run's own timeout); a ticket may start any tenant's execution.
    """
    ring, members, pending = ExecutionKeys(settings.redis.key_prefix).queue(queue.name)  # the entry beside its ticket
    entry = json.dumps({"execution_id": record.id, "traceparent": traceparent})
    with redis_errors(), queue.connection.pipeline() as pipe:
        _ticket(queue, settings, backstop_s, f"dispatch ticket (queued with {record.id})", pipe)
        queue.connection.register_script(_PUSH)(
            keys=[ring, members, pending + record.tenant], args=[record.tenant, entry], client=pipe
        )
        pipe.execute()


def requeue(client: redis.Redis, record: ExecutionRecord, traceparent: str, settings: ExecutionsConfig,
            backstop_s: int) -> None:  # fmt: skip
    """Queue an execution again (it runs again in place) on the queue it was accepted on, whichever
    deployment's process settles it (a reaper settles every queue's lost executions)."""
    queue = Queue(record.queue or settings.queue.name, connection=client, serializer=JSONSerializer)
    enqueue(queue, record, traceparent, settings, backstop_s)


def take_next(client: redis.Redis, settings: ExecutionsConfig) -> QueueEntry | None:
    """The next execution in tenant round-robin order, or None when no tenant has one waiting; the
    caller calls `taken` with it once its record has left queued (or when it skips it)."""
    ring, members, pending = _keys(settings)
    with redis_errors():
        raw = client.register_script(_TAKE)(keys=[ring, members, _taken_key(settings)], args=[pending, time.time()])
    if not raw:
        return None
    text = _text(raw)
    data = json.loads(text)
    return QueueEntry(str(data["execution_id"]), data.get("traceparent"), text)


def taken(client: redis.Redis, settings: ExecutionsConfig, entry: QueueEntry) -> None:
    """The entry's record has left queued (or was skipped): it needs no putting back."""
    with redis_errors():
        client.zrem(_taken_key(settings), entry.raw)


def return_lost_takes(
    client: redis.Redis, settings: ExecutionsConfig, lookup: Callable[[str], ExecutionRecord | None], grace_s: float
) -> int:
    """Put back on its tenant's list each entry taken more than `grace_s` ago whose record
    (`lookup`) is still queued, and forget the others; returns how many went back. Their tickets
    are `restore_tickets`' to add."""
    ring, members, pending = _keys(settings)
    key = _taken_key(settings)
    put_back = client.register_script(_PUT_BACK)
    returned = 0
    with redis_errors():
        stale = client.zrangebyscore(key, "-inf", time.time() - grace_s)
        for raw in stale:
            text = _text(raw)
            try:
                record = lookup(str(json.loads(text)["execution_id"]))
            except (ValueError, KeyError, TypeError):
                log.warning("dropping an unreadable taken entry: %.200r", text)
                record = None
            if record is None or record.status is not ExecutionStatus.QUEUED:
                client.zrem(key, text)
                continue
            log.warning(
                "execution %s was taken over %.0f s ago and is still queued: its entry goes back", record.id, grace_s
            )
            returned += put_back(keys=[ring, members, pending + record.tenant, key], args=[record.tenant, text])
    return returned


def restore_tickets(queue: Queue, settings: ExecutionsConfig, backstop_s: int) -> int:
    """Queue a ticket for every waiting entry beyond the tickets waiting; returns how many.

    Both counts are read in one transaction. An entry whose ticket a worker has just taken (it
    takes the entry a moment later) is counted as lacking one, which at worst adds a spare.
    """
    _, members, pending = _keys(settings)
    client = queue.connection
    with redis_errors():
        tenants = [t.decode() if isinstance(t, bytes) else str(t) for t in client.smembers(members)]
        with client.pipeline(transaction=True) as pipe:
            pipe.llen(queue.key)
            for tenant in tenants:
                pipe.llen(pending + tenant)
            tickets, *entries = pipe.execute()
        missing = sum(entries) - int(tickets)
        if missing <= 0:
            return 0
        with client.pipeline() as pipe:
            for _ in range(missing):
                _ticket(queue, settings, backstop_s, "dispatch ticket (restored)", pipe)
            pipe.execute()
    return int(missing)


def depth(queue: Queue) -> int:
    with redis_errors():
        return int(queue.count)


__all__ = [
    "JOB_FUNCTIONS",
    "TASK",
    "QueueEntry",
    "depth",
    "enqueue",
    "make_queue",
    "requeue",
    "restore_tickets",
    "return_lost_takes",
    "take_next",
    "taken",
]
