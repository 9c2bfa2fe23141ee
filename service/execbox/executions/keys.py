"""The executions room's Redis keys: records, the queue's fair dispatch, signals, the outbox, live events.

`ExecutionKeys` also carries the keys of the rooms an execution's life passes through below this one
(files, tenancy, fleet, egress, sandbox, the loops'), so the code that runs an execution needs one
key object; it names only its own keys here.
"""

from __future__ import annotations

from execbox.core.keys import KeySpec, LoopKeys
from execbox.egress.keys import EgressKeys
from execbox.files.keys import FileKeys
from execbox.fleet.keys import FleetKeys
from execbox.sandbox.keys import SandboxKeys
from execbox.tenancy.keys import TenancyKeys

LOOPS: tuple[str, ...] = ("reaper",)
"""The background loop that settles this room's records when a worker or a deadline is lost (the
reaper, run by every worker): its `loop` label, its dead letters (`execbox.keyschema.LOOPS`)."""

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "exe:{id}",
        "string (JSON ExecutionRecord)",
        "retention_s after the last write",
        ("api", "worker"),
        (),
        "the execution record; every status change is a WATCH/MULTI compare-and-set",
    ),
    KeySpec(
        "deadlines",
        "zset id -> queue deadline",
        "none",
        ("api", "worker"),
        (),
        "executions still queued, for the expiry sweep",
    ),
    KeySpec(
        "running",
        "set of ids",
        "none",
        ("api", "worker"),
        ("admin",),
        "executions running now, for the lost-worker sweep",
    ),
    KeySpec(
        "lease:{id}",
        "string (worker name)",
        "worker.lease_s, renewed",
        ("worker", "api"),
        ("admin",),
        "the running worker's lease",
    ),
    KeySpec(
        "cancel:{id}", "list", "retention_s", ("api", "worker"), (), "signals to the running worker: `cancel`, `stop`"
    ),
    KeySpec("done:{id}", "pub/sub channel", "-", ("api", "worker"), (), "told when the execution ends"),
    KeySpec(
        "events",
        "stream",
        "~100,000 entries",
        ("api", "worker"),
        (),
        "the outbox: one entry per terminal status change, read by consumer groups (webhooks)",
    ),
    KeySpec(
        "live:{id}",
        "stream of live events",
        "retention_s; ~2,000 entries",
        ("worker", "api"),
        (),
        "an execution's stdout, stderr, result and status events as they happen (SSE)",
    ),
    KeySpec("q:{queue}:ring", "list of tenants", "none", ("api", "worker"), (), "fair dispatch: tenants in turn"),
    KeySpec("q:{queue}:ring:members", "set of tenants", "none", ("api", "worker"), (), "tenants on the ring"),
    KeySpec("q:{queue}:pending:{tenant}", "list of ids", "none", ("api", "worker"), (), "a tenant's queued entries"),
    KeySpec(
        "q:{queue}:taken",
        "sorted set of entries by time taken",
        "none",
        ("worker",),
        (),
        "entries a worker took whose record it has not yet seen leave queued (the reaper puts back lost ones)",
    ),
    KeySpec(
        "t:idem:{tenant}:{route}:{key}",
        "string (JSON) + pub/sub",
        "api.idempotency_ttl_s",
        ("api",),
        (),
        "an Idempotency-Key's claim, then its answer",
    ),
)


class ExecutionKeys(TenancyKeys, FileKeys, FleetKeys, EgressKeys, SandboxKeys, LoopKeys):
    def execution(self, execution_id: str) -> str:
        return self._k("exe", execution_id)

    @property
    def deadlines(self) -> str:
        return self._k("deadlines")

    @property
    def running(self) -> str:
        return self._k("running")

    def lease(self, execution_id: str) -> str:
        return self._k("lease", execution_id)

    def signals(self, execution_id: str) -> str:
        return self._k("cancel", execution_id)

    def done(self, execution_id: str) -> str:
        return self._k("done", execution_id)

    @property
    def events(self) -> str:
        return self._k("events")

    def stream(self, execution_id: str) -> str:
        return self._k("live", execution_id)

    def queue(self, queue: str) -> tuple[str, str, str]:
        """Fair dispatch of one queue: the ring of tenants, its member set, the prefix of the pending lists."""
        base = self._k("q", queue)
        return f"{base}:ring", f"{base}:ring:members", f"{base}:pending:"

    def taken(self, queue: str) -> str:
        """A queue's entries taken by a worker and not yet seen running."""
        return self._k("q", queue, "taken")

    def idempotency(self, tenant: str, route: str, key: str) -> str:
        return self._t("idem", tenant, route, key)


__all__ = ["LOOPS", "SCHEMA", "ExecutionKeys"]
