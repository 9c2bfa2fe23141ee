"""Execution records in Redis: creation, atomic status transitions, leases, signals and sweeps.

Keys: execbox.executions.keys (exe, deadlines, running, lease, cancel, done, events) and tenancy's
active set. A status change is a WATCH/MULTI compare-and-set; a terminal one also appends the outbox event, frees the
tenant's quota slot (execbox.tenancy.quotas.free, the room that takes it) and drops the lease in
the same transaction. A mutation only edits the record: it may run again on a retry, so it
writes nothing else (the lifecycle writes its blobs before).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import redis

from execbox.core.errors import QueueUnavailable, ServiceError
from execbox.core.redis import compare_and_set, redis_errors, text
from execbox.core.streams import TERMINAL, EventStream
from execbox.executions import live
from execbox.executions.keys import ExecutionKeys
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, Transition
from execbox.executions.settings import ExecutionsConfig
from execbox.executions.settle import mark_expired_if_due, settle_uncertain
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.tenancy import quotas
from execbox.tenancy.budget import StorageBudget, bucket

log = logging.getLogger(__name__)

Mutation = Callable[[ExecutionRecord], "ExecutionStatus | None"]
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class ExecutionStore:
    def __init__(self, client: redis.Redis, settings: ExecutionsConfig) -> None:
        self.redis = client
        self.keys = ExecutionKeys(settings.redis.key_prefix)
        self._retention_s = settings.retention_s
        self._lease_s = settings.worker.lease_s
        self.events = EventStream(client, self.keys.events)
        """The outbox: every terminal status change is appended in its own transaction."""
        self.budget = StorageBudget(client, self.keys)
        """The tenants' storage budgets: an ending execution's reserve is settled to what it keeps."""
        self.listeners: list[Callable[[ExecutionRecord], None]] = []
        """In-process listeners, called once per execution this process settles (wired by
        execbox.executions.events.subscribe; durable consumers read `events` instead)."""

    def done_channel(self, execution_id: str) -> str:
        return self.keys.done(execution_id)

    def ping(self) -> None:
        with redis_errors():
            self.redis.ping()

    def memory(self) -> tuple[int, int]:
        """Redis's used memory and its maxmemory (0: unlimited) in bytes."""
        with redis_errors():
            info = self.redis.info("memory")
        return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))

    def create(self, record: ExecutionRecord) -> None:
        ttl = int(record.queue_deadline - time.time() + self._retention_s)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.set(self.keys.execution(record.id), record.model_dump_json(), ex=ttl, nx=True)
            pipe.zadd(self.keys.deadlines, {record.id: record.queue_deadline})
            live.append(pipe, self.keys, record.id, "status", {"status": record.status.value}, ttl)
            pipe.execute()

    def replicated(self, execution_id: str, replicas: int, timeout_ms: int) -> None:
        """Return once `replicas` replicas hold every write made before this call (the acceptance's
        record, queue entry and idempotency key); QueueUnavailable (503, retryable) when fewer
        acknowledge within timeout_ms, though the execution may still run.

        WAIT counts only its own connection's writes, and the acceptance's are spread over several
        pooled connections: this connection writes once more (a PUBLISH, which Redis replicates
        whoever listens; waiters of this execution just re-read it) and waits in the same round
        trip. The replication stream is ordered, so a replica that has this write has all of them.
        """
        with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            pipe.publish(self.keys.done(execution_id), "accepted")
            pipe.execute_command("WAIT", replicas, timeout_ms)  # type: ignore[no-untyped-call]
            _, acknowledged = pipe.execute()
        if int(acknowledged) < replicas:
            raise QueueUnavailable(
                f"execution {execution_id} reached {acknowledged} of {replicas} Redis replica(s) in "
                f"{timeout_ms} ms; retry with the same Idempotency-Key to get it, not a second one"
            )

    def get(self, execution_id: str) -> ExecutionRecord | None:
        with redis_errors():
            raw = self.redis.get(self.keys.execution(execution_id))
        return None if raw is None else ExecutionRecord.model_validate_json(raw)

    def _compare_and_set(
        self, execution_id: str, change: Callable[[ExecutionRecord, redis.client.Pipeline], bool]
    ) -> ExecutionRecord | None:
        """Read, let `change` edit the record and queue its writes, commit unless the record moved.

        `change` returns False to abandon. Retried on a concurrent write (WATCH/MULTI).
        """
        return compare_and_set(
            self.redis, self.keys.execution(execution_id), ExecutionRecord.model_validate_json, change
        )

    def transition(
        self, execution_id: str, allowed: set[ExecutionStatus], by: str, mutate: Mutation, lease: bool = False
    ) -> ExecutionRecord | None:
        """Move an execution out of one of the `allowed` statuses atomically.

        `mutate` edits the record and returns the new status, or None to abandon the change.
        Returns the new record, or None when the execution is missing, not in an allowed
        status, or the change was abandoned. With `lease`, a move to running also takes the run's
        lease for `by`; a terminal status is published to its waiters, both in the same transaction.
        """

        charged: list[tuple[int, int]] = []

        def change(record: ExecutionRecord, pipe: redis.client.Pipeline) -> bool:
            if record.status not in allowed:
                return False
            new = mutate(record)
            if new is None:
                return False
            now = time.time()
            charged[:] = []
            if new.terminal and record.kept_bytes:  # the worst case reserved becomes what it keeps, from now
                charged[:] = [(record.kept_bucket, -record.kept_bytes)]
                record.kept_bytes, record.kept_bucket = kept_size(record), bucket(now + self._retention_s)
                charged.append((record.kept_bucket, record.kept_bytes))
            record.status = new
            record.transitions.append(Transition(status=new, at=now, by=by))
            self._write(pipe, record, now)
            if lease and new is ExecutionStatus.RUNNING:
                pipe.set(self.keys.lease(execution_id), by, px=int(self._lease_s * 1000))
            if new.terminal:
                pipe.publish(self.done_channel(execution_id), new.value)
            return True

        record = self._compare_and_set(execution_id, change)
        if record is not None and charged:
            try:
                self.budget.settle(record.tenant, charged)
            except ServiceError as exc:  # the reserve stays counted until it expires
                log.warning("execution %s: its storage charge was not settled: %s", execution_id, exc.message)
        if record is not None and record.status.terminal:
            for listener in self.listeners:
                listener(record)
        return record

    def update(self, execution_id: str, mutate: Callable[[ExecutionRecord], None]) -> ExecutionRecord | None:
        """Edit a record without changing its status (e.g. append a webhook delivery)."""

        def change(record: ExecutionRecord, pipe: redis.client.Pipeline) -> bool:
            mutate(record)
            pipe.set(self.keys.execution(execution_id), record.model_dump_json(), keepttl=True)
            return True

        return self._compare_and_set(execution_id, change)

    def _write(self, pipe: redis.client.Pipeline, record: ExecutionRecord, now: float) -> None:
        if record.status.terminal:
            record.finished_at = record.finished_at or now
        pipe.set(self.keys.execution(record.id), record.model_dump_json(), ex=self._retention_s)
        ttl = self._retention_s
        if record.status.terminal:
            for result in record.results:
                live.append(pipe, self.keys, record.id, "result", result.model_dump(mode="json"), ttl)
        live.append(pipe, self.keys, record.id, "status", {"status": record.status.value}, ttl)
        if record.status.terminal:
            # Only a mark: the reader sends the stored record itself, so the stream keeps no second copy.
            live.append(pipe, self.keys, record.id, live.END, {"status": record.status.value}, ttl)
        if record.status is ExecutionStatus.RUNNING:
            pipe.zrem(self.keys.deadlines, record.id)
            pipe.sadd(self.keys.running, record.id)
        elif record.status is ExecutionStatus.QUEUED:  # approved, or run again in place: it waits anew
            pipe.zadd(self.keys.deadlines, {record.id: record.queue_deadline})
            pipe.srem(self.keys.running, record.id)
            pipe.delete(self.keys.lease(record.id), self.keys.signals(record.id))
        elif record.status.terminal:
            # The outbox: the event is written in the status change's own transaction, so no
            # consumer (webhook delivery) can miss it, whichever process dies when.
            self.events.append(pipe, {"type": TERMINAL, "id": record.id, "status": record.status.value})
            quotas.free(pipe, self.keys, record.tenant, record.id)
            pipe.zrem(self.keys.deadlines, record.id)
            pipe.srem(self.keys.running, record.id)
            pipe.delete(self.keys.lease(record.id), self.keys.signals(record.id))

    # -- terminal transitions that the API, workers and the reaper share --------------------

    def expire_if_due(self, execution_id: str, by: str) -> ExecutionRecord | None:
        waiting = {ExecutionStatus.QUEUED, ExecutionStatus.AWAITING_APPROVAL}
        return self.transition(execution_id, waiting, by, mark_expired_if_due)

    def fail_if_lost(self, execution_id: str, by: str) -> ExecutionRecord | None:
        """Settle a running execution whose worker stopped renewing its lease: failed (undeclared),
        or what its declared effect calls for (execbox.executions.effects): queued again (the caller
        then queues its entry), `unknown_outcome`, or failed."""

        def lost(record: ExecutionRecord) -> ExecutionStatus | None:
            started = record.started_at or 0.0
            if time.time() - started < self._lease_s or self.lease_alive(execution_id):
                return None
            record.error = ExecutionError(
                category=ErrorCategory.SANDBOX_ERROR,
                message=f"worker {record.worker} stopped renewing its lease while the code ran (worker or host "
                "lost); the run's result is unknown; submit again",
                retryable=True,
                details={"worker": record.worker, "reason": "worker_lost"},
            )
            return settle_uncertain(record)

        return self.transition(execution_id, {ExecutionStatus.RUNNING}, by, lost)

    # -- leases, cancel signals, sweeps -----------------------------------------------------

    def renew_lease(self, execution_id: str, worker: str) -> None:
        """Renew the run's lease for `worker`, or take it again when it lapsed (Redis was away); never
        over another worker's: an execution queued again after its worker was declared lost is
        another worker's now, and the first one's late renewals must not keep it alive."""
        with redis_errors():
            self.redis.register_script(_RENEW)(
                keys=[self.keys.lease(execution_id)], args=[worker, int(self._lease_s * 1000)]
            )

    def lease_holder(self, execution_id: str) -> str | None:
        with redis_errors():
            held = self.redis.get(self.keys.lease(execution_id))
        return None if held is None else text(held)

    def lease_alive(self, execution_id: str) -> bool:
        with redis_errors():
            return bool(self.redis.exists(self.keys.lease(execution_id)))

    def signal(self, execution_id: str, message: str) -> None:
        """Tell the worker running execution_id something: `cancel`, or `stop` (the run ended)."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(self.keys.signals(execution_id), message)
            pipe.expire(self.keys.signals(execution_id), self._retention_s)
            pipe.execute()

    def wait_signal(self, execution_id: str, timeout_s: float) -> str | None:
        """Block up to timeout_s for a signal to the running worker; None when none came."""
        with redis_errors():
            got = self.redis.blpop([self.keys.signals(execution_id)], timeout=timeout_s)
        return None if got is None else text(got[1])

    def due_for_expiry(self) -> list[str]:
        with redis_errors():
            ids = self.redis.zrangebyscore(self.keys.deadlines, "-inf", time.time())
        return [text(i) for i in ids]

    def running(self) -> list[str]:
        with redis_errors():
            return sorted(text(i) for i in self.redis.smembers(self.keys.running))

    def holders(self) -> dict[str, str]:
        """Running execution id -> the worker holding its lease (one whose lease lapsed is left out)."""
        ids = self.running()
        with redis_errors():
            values = self.redis.mget([self.keys.lease(i) for i in ids]) if ids else []
        return {i: text(v) for i, v in zip(ids, values, strict=True) if v is not None}


def kept_size(record: ExecutionRecord) -> int:
    """About the bytes an ended execution keeps: its record, and its live events' copy of the output
    (JSON with ASCII escapes; a stream kept as base64 was sent live as text with U+FFFD, up to 6 bytes a byte)."""
    live = 0
    for text_, encoding in ((record.stdout, record.stdout_encoding), (record.stderr, record.stderr_encoding)):
        live += len(json.dumps(text_)) if encoding == "utf-8" else 6 * (len(text_) * 3 // 4)
    results = len(json.dumps([r.model_dump(mode="json") for r in record.results])) if record.results else 0
    return len(record.model_dump_json()) + live + results + (1 << 10)
