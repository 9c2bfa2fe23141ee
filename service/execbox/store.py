"""Execution records in Redis: creation, atomic status transitions, leases and signals.

Keys (prefix from settings.redis.key_prefix):
  {p}:exe:{id}        the ExecutionRecord as JSON; expires retention_s after the last write
  {p}:deadlines       zset id -> queue deadline, for executions still queued
  {p}:running         set of ids currently running
  {p}:lease:{id}      the running worker's lease; it renews it while the sandbox runs
  {p}:cancel:{id}     list a cancel request is pushed to; the running worker blocks on it
  {p}:done:{id}       pub/sub channel told when the execution reaches a terminal status
  {p}:file:{id}       an uploaded or inline input file (hash: meta, data)
  {p}:rate:{tenant}:{minute}, {p}:active:{tenant}   quota counters (per minute; zset of queued or running ids)
  {p}:worker:{name}   a worker's heartbeat
  {p}:q:{queue}:ring, :ring:members, :pending:{tenant}   fair dispatch (execbox.queue)
  {p}:apikey:{digest}, {p}:apikeys   API keys (execbox.auth);  {p}:idem:...   idempotency (execbox.idempotency)
  {p}:egress:rule:{address}   the egress rule for the execution whose network the proxy has that address on
  {p}:egress:slot:{subnet}    a per-run network slot, reserved by a worker, cooling down after the run
  {p}:uid:{uid}       a sandbox uid held by a live container (execbox.sandbox.uids)
  {p}:egress:denied:{id}      the proxy's refusals for an execution (JSON list)
  {p}:secret:{tenant}:{host}  hash: header name -> JSON {sealed, tls}, opened only by the proxy (tenant `*`: everyone)
  {p}:events          stream of status changes (the outbox), read by consumer groups (webhooks)
  {p}:due:{name}      zset member -> time it is due (webhook retries)
  rq:*                RQ's own keys (tickets, registries, workers)

Which component may touch which of these is fixed by its Redis role (execbox.redis_roles).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.exceptions import RedisError, WatchError

from execbox.errors import QueueUnavailable
from execbox.models import ErrorCategory, ExecutionError, ExecutionRecord, ExecutionStatus, FilePublic, Transition
from execbox.settings import Settings

Mutation = Callable[[ExecutionRecord], "ExecutionStatus | None"]
EVENTS_MAXLEN = 100_000
"""The event stream keeps about this many entries (consumers keep up within seconds)."""
UID_HOLD_S = 4 * 3600
"""Longest a sandbox uid stays reserved when its worker died holding it (a warm container waits at
most max_idle_s, a run at most its timeout; both far below this)."""
_ADMIT = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then return {'rate', count} end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return {'running', count} end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return {'ok', count + 1}
"""
_COOL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], 'cooling', 'PX', ARGV[2]) end
"""


@contextmanager
def redis_errors() -> Iterator[None]:
    """Translate redis-py failures into the service's taxonomy at this seam."""
    try:
        yield
    except RedisError as exc:
        raise QueueUnavailable(f"Redis is unreachable or failing ({exc}); retry shortly") from exc


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def connect(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
    )


class ExecutionStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self._p = settings.redis.key_prefix
        self._retention_s = settings.retention_s
        self._lease_s = settings.worker.lease_s
        self.terminal_hooks: list[Callable[[ExecutionRecord], None]] = []
        """Called once per execution this process settles (outcome metrics, webhook jobs)."""

    def _key(self, kind: str, execution_id: str = "") -> str:
        return f"{self._p}:{kind}:{execution_id}" if execution_id else f"{self._p}:{kind}"

    @property
    def events_stream(self) -> str:
        return self._key("events")

    # -- the event stream (consumer groups) ------------------------------------------------

    def ensure_group(self, group: str) -> None:
        with redis_errors():
            try:
                self.redis.xgroup_create(self.events_stream, group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def read_events(self, group: str, consumer: str, block_s: float, idle_s: float) -> list[tuple[str, dict[str, str]]]:
        """Events for this consumer: first those a dead consumer left pending for idle_s, then new ones."""
        with redis_errors():
            reply: Any = self.redis.xautoclaim(self.events_stream, group, consumer, int(idle_s * 1000), count=16)
            entries = list(reply[1] or [])
            if not entries:
                got: Any = self.redis.xreadgroup(group, consumer, {self.events_stream: ">"}, count=16,
                                                 block=max(int(block_s * 1000), 1))  # fmt: skip
                entries = [entry for _, stream_entries in got or [] for entry in stream_entries]
        return [(_text(i), {_text(k): _text(v) for k, v in fields.items()}) for i, fields in entries if fields]

    def ack_event(self, group: str, event_id: str) -> None:
        with redis_errors():
            self.redis.xack(self.events_stream, group, event_id)

    def schedule(self, name: str, member: str, at: float) -> None:
        """Put member on a delayed set (retries are due at `at`, read by whoever takes due work)."""
        with redis_errors():
            self.redis.zadd(self._key("due", name), {member: at})

    def take_due(self, name: str, limit: int = 16) -> list[str]:
        """Members due by now, each taken by exactly one caller (the one whose ZREM removed it)."""
        key = self._key("due", name)
        with redis_errors():
            due = [_text(m) for m in self.redis.zrangebyscore(key, "-inf", time.time(), start=0, num=limit)]
            return [m for m in due if self.redis.zrem(key, m)]

    def done_channel(self, execution_id: str) -> str:
        return self._key("done", execution_id)

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
            pipe.set(self._key("exe", record.id), record.model_dump_json(), ex=ttl, nx=True)
            pipe.zadd(self._key("deadlines"), {record.id: record.queue_deadline})
            pipe.execute()

    def get(self, execution_id: str) -> ExecutionRecord | None:
        with redis_errors():
            raw = self.redis.get(self._key("exe", execution_id))
        return None if raw is None else ExecutionRecord.model_validate_json(raw)

    def _compare_and_set(
        self, execution_id: str, change: Callable[[ExecutionRecord, redis.client.Pipeline], bool]
    ) -> ExecutionRecord | None:
        """Read, let `change` edit the record and queue its writes, commit unless the record moved.

        `change` returns False to abandon. Retried on a concurrent write (WATCH/MULTI).
        """
        key = self._key("exe", execution_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]
                    raw = pipe.get(key)
                    if raw is None:
                        return None
                    record = ExecutionRecord.model_validate_json(raw)
                    pipe.multi()
                    if not change(record, pipe):
                        pipe.reset()
                        return None
                    pipe.execute()
                    return record
                except WatchError:
                    continue

    def transition(
        self, execution_id: str, allowed: set[ExecutionStatus], by: str, mutate: Mutation
    ) -> ExecutionRecord | None:
        """Move an execution out of one of the `allowed` statuses atomically.

        `mutate` edits the record and returns the new status, or None to abandon the change.
        Returns the new record, or None when the execution is missing, not in an allowed
        status, or the change was abandoned.
        """

        def change(record: ExecutionRecord, pipe: redis.client.Pipeline) -> bool:
            if record.status not in allowed:
                return False
            new = mutate(record)
            if new is None:
                return False
            now = time.time()
            record.status = new
            record.transitions.append(Transition(status=new, at=now, by=by))
            self._write(pipe, record, now)
            return True

        record = self._compare_and_set(execution_id, change)
        if record is not None and record.status.terminal:
            with redis_errors():
                self.redis.publish(self.done_channel(execution_id), record.status.value)
            for hook in self.terminal_hooks:
                hook(record)
        return record

    def update(self, execution_id: str, mutate: Callable[[ExecutionRecord], None]) -> ExecutionRecord | None:
        """Edit a record without changing its status (e.g. append a webhook delivery)."""

        def change(record: ExecutionRecord, pipe: redis.client.Pipeline) -> bool:
            mutate(record)
            pipe.set(self._key("exe", execution_id), record.model_dump_json(), keepttl=True)
            return True

        return self._compare_and_set(execution_id, change)

    def _write(self, pipe: redis.client.Pipeline, record: ExecutionRecord, now: float) -> None:
        if record.status.terminal:
            record.finished_at = record.finished_at or now
        pipe.set(self._key("exe", record.id), record.model_dump_json(), ex=self._retention_s)
        if record.status is ExecutionStatus.RUNNING:
            pipe.zrem(self._key("deadlines"), record.id)
            pipe.sadd(self._key("running"), record.id)
        elif record.status.terminal:
            # The outbox: the event is written in the status change's own transaction, so no
            # consumer (webhook delivery) can miss it, whichever process dies when.
            event = {"type": "execution.terminal", "id": record.id, "status": record.status.value}
            pipe.xadd(self.events_stream, event, maxlen=EVENTS_MAXLEN, approximate=True)  # type: ignore[arg-type]
            pipe.zrem(self._key("active", record.tenant), record.id)
            pipe.zrem(self._key("deadlines"), record.id)
            pipe.srem(self._key("running"), record.id)
            pipe.delete(self._key("lease", record.id), self._key("cancel", record.id))

    # -- terminal transitions that the API, workers and the reaper share --------------------

    def expire_if_due(self, execution_id: str, by: str) -> ExecutionRecord | None:
        def due(record: ExecutionRecord) -> ExecutionStatus | None:
            if time.time() < record.queue_deadline:
                return None
            record.error = ExecutionError(
                category=ErrorCategory.EXPIRED,
                message=f"no worker started it within its queue deadline of {record.policy.queue_timeout_s:g} s; "
                "submit again, or raise policy.queue_timeout_s",
                retryable=True,
            )
            return ExecutionStatus.EXPIRED

        return self.transition(execution_id, {ExecutionStatus.QUEUED}, by, due)

    def fail_if_lost(self, execution_id: str, by: str) -> ExecutionRecord | None:
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
            return ExecutionStatus.FAILED

        return self.transition(execution_id, {ExecutionStatus.RUNNING}, by, lost)

    # -- uploaded and inline input files ----------------------------------------------------

    def put_file(self, data: bytes, name: str, ttl_s: int, tenant: str) -> FilePublic:
        now = time.time()
        meta = FilePublic(
            id="file_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower(),
            name=name,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=now,
            expires_at=now + ttl_s,
            tenant=tenant,
        )
        key = self._key("file", meta.id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.hset(key, mapping={"meta": meta.model_dump_json(), "data": data})
            pipe.expire(key, ttl_s)
            pipe.execute()
        return meta

    def file_meta(self, file_id: str) -> FilePublic | None:
        with redis_errors():
            raw = self.redis.hget(self._key("file", file_id), "meta")
        return None if raw is None else FilePublic.model_validate_json(raw)

    def file_data(self, file_id: str) -> bytes | None:
        with redis_errors():
            raw = self.redis.hget(self._key("file", file_id), "data")
        return None if raw is None else raw if isinstance(raw, bytes) else raw.encode()

    def keep_file(self, file_id: str, until: float) -> None:
        """Make sure a file outlives an execution that refers to it."""
        with redis_errors():
            self.redis.expireat(self._key("file", file_id), int(until) + 1, gt=True)

    # -- tenant quotas ------------------------------------------------------------------------

    def admit(self, tenant: str, execution_id: str, minute: int, per_minute: int, running: int) -> tuple[str, int]:
        """One atomic admission: ("ok", count) counts the submission in the tenant's minute and
        takes a slot among its queued or running executions; ("rate" | "running", count) refuses
        and changes nothing (a refused request does not use up the window)."""
        keys = [self._key("rate", f"{tenant}:{minute}"), self._key("active", tenant)]
        with redis_errors():
            verdict, count = self.redis.register_script(_ADMIT)(
                keys=keys, args=[per_minute, running, execution_id, time.time()]
            )
        return _text(verdict), int(count)

    def release_slot(self, tenant: str, execution_id: str) -> None:
        with redis_errors():
            self.redis.zrem(self._key("active", tenant), execution_id)

    def reclaim_slots(self, older_than_s: float) -> int:
        """Give back slots whose execution was never created (an API died between admission and
        create) or has ended; only slots older than older_than_s, so a create in flight keeps its own."""
        freed = 0
        cutoff = time.time() - older_than_s
        with redis_errors():
            for key in self.redis.scan_iter(match=self._key("active", "*"), count=100):
                stale = [_text(m) for m in self.redis.zrangebyscore(key, "-inf", cutoff)]
                for execution_id in stale:
                    record = self.get(execution_id)
                    if record is None or record.status.terminal:
                        freed += int(self.redis.zrem(key, execution_id))
        return freed

    # -- worker heartbeats ------------------------------------------------------------------

    def report_worker(
        self, name: str, docker_ok: bool, detail: str, ttl_s: float, missing: list[str], runtimes: list[str]
    ) -> None:
        payload = json.dumps({"name": name, "docker_ok": docker_ok, "detail": detail, "missing_images": missing,
                              "runtimes": runtimes, "at": time.time()})  # fmt: skip
        with redis_errors():
            self.redis.set(self._key("worker", name), payload, px=int(ttl_s * 1000))

    def workers(self) -> list[dict[str, object]]:
        with redis_errors():
            keys = list(self.redis.scan_iter(match=self._key("worker", "*"), count=100))
            values = self.redis.mget(keys) if keys else []
        return [json.loads(v) for v in values if v is not None]

    # -- egress: rules, refusals, secrets ---------------------------------------------------

    def put_egress_rule(self, address: str, rule_json: str, ttl_s: float) -> None:
        with redis_errors():
            self.redis.set(self._key("egress:rule", address), rule_json, px=int(ttl_s * 1000))

    def egress_rule(self, address: str) -> str | None:
        with redis_errors():
            value = self.redis.get(self._key("egress:rule", address))
        return None if value is None else _text(value)

    def drop_egress_rule(self, address: str) -> None:
        with redis_errors():
            self.redis.delete(self._key("egress:rule", address))

    def add_denial(self, execution_id: str, entry: dict[str, object], limit: int = 100) -> None:
        """Keep the first `limit` refusals of an execution (a flood of them is not a memory problem)."""
        key = self._key("egress:denied", execution_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(key, json.dumps(entry))
            pipe.ltrim(key, 0, limit - 1)
            pipe.expire(key, self._retention_s)
            pipe.execute()

    def denials(self, execution_id: str) -> list[dict[str, object]]:
        with redis_errors():
            return [json.loads(v) for v in self.redis.lrange(self._key("egress:denied", execution_id), 0, -1)]

    def reserve_slot(self, subnet: str, execution_id: str, ttl_s: float) -> bool:
        """Reserve a per-run network slot; False when another run holds it or it is cooling down."""
        with redis_errors():
            return bool(self.redis.set(self._key("egress:slot", subnet), execution_id, nx=True, px=int(ttl_s * 1000)))

    def cool_slot(self, subnet: str, execution_id: str, cooldown_s: float) -> None:
        """The run's network is gone: keep the slot unused for cooldown_s more (only if still ours)."""
        with redis_errors():
            self.redis.register_script(_COOL)(
                keys=[self._key("egress:slot", subnet)], args=[execution_id, max(int(cooldown_s * 1000), 1)]
            )

    def reserve_uid(self, uid: int) -> bool:
        """Claim a sandbox uid for one container's life (expires on its own after UID_HOLD_S)."""
        with redis_errors():
            return bool(self.redis.set(self._key("uid", str(uid)), "1", nx=True, ex=UID_HOLD_S))

    def release_uid(self, uid: int) -> None:
        with redis_errors():
            self.redis.delete(self._key("uid", str(uid)))

    def set_secret(self, tenant: str, host: str, header: str, sealed: str, tls: bool) -> None:
        """Store a header value sealed to the egress proxy (execbox.egress.sealing); never a plaintext."""
        with redis_errors():
            self.redis.hset(self._key("secret", f"{tenant}:{host}"), header, json.dumps({"sealed": sealed, "tls": tls}))

    def delete_secret(self, tenant: str, host: str, header: str) -> bool:
        with redis_errors():
            return bool(self.redis.hdel(self._key("secret", f"{tenant}:{host}"), header))

    def secret_names(self) -> list[tuple[str, str, str, bool]]:
        """(tenant, host, header, tls) of every registered secret; never the values."""
        return [(tenant, host, header, tls) for tenant, host, header, _, tls in self.sealed_secrets()]

    def secrets_for(self, tenant: str, host: str) -> list[tuple[str, str, bool]]:
        """(header, sealed value, tls) to add on requests to host: the operator's for everyone, then
        the tenant's."""
        merged: dict[str, tuple[str, str, bool]] = {}
        with redis_errors():
            for owner in ("*", tenant):
                for header, raw in self.redis.hgetall(self._key("secret", f"{owner}:{host}")).items():
                    data = json.loads(raw)
                    merged[_text(header).lower()] = (_text(header), str(data["sealed"]), bool(data["tls"]))
        return list(merged.values())

    def sealed_secrets(self) -> list[tuple[str, str, str, str, bool]]:
        """(tenant, host, header, sealed value, tls) of every secret, for re-sealing under a new key."""
        found = []
        with redis_errors():
            for key in self.redis.scan_iter(match=self._key("secret", "*"), count=100):
                tenant, _, host = _text(key).removeprefix(self._key("secret", "")).partition(":")
                for header, raw in self.redis.hgetall(key).items():
                    data = json.loads(raw)
                    found.append((tenant, host, _text(header), str(data["sealed"]), bool(data["tls"])))
        return sorted(found)

    # -- leases, cancel signals, sweeps -----------------------------------------------------

    def renew_lease(self, execution_id: str, worker: str) -> None:
        with redis_errors():
            self.redis.set(self._key("lease", execution_id), worker, px=int(self._lease_s * 1000))

    def lease_alive(self, execution_id: str) -> bool:
        with redis_errors():
            return bool(self.redis.exists(self._key("lease", execution_id)))

    def signal(self, execution_id: str, message: str) -> None:
        """Tell the worker running execution_id something: `cancel`, or `stop` (the run ended)."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(self._key("cancel", execution_id), message)
            pipe.expire(self._key("cancel", execution_id), self._retention_s)
            pipe.execute()

    def wait_signal(self, execution_id: str, timeout_s: float) -> str | None:
        """Block up to timeout_s for a signal to the running worker; None when none came."""
        with redis_errors():
            got = self.redis.blpop([self._key("cancel", execution_id)], timeout=timeout_s)
        return None if got is None else _text(got[1])

    def due_for_expiry(self) -> list[str]:
        with redis_errors():
            ids = self.redis.zrangebyscore(self._key("deadlines"), "-inf", time.time())
        return [_text(i) for i in ids]

    def running(self) -> list[str]:
        with redis_errors():
            return sorted(_text(i) for i in self.redis.smembers(self._key("running")))
