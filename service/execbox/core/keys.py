"""The Redis key schema: every key execbox writes, its type, lifetime and the roles that use it.

The key schema is the real interface between the API, the workers and the egress proxy: a store
builds its keys here and nowhere else, and `execbox.core.redis_roles` grants each role exactly
these patterns (a unit test checks that every role named below can reach its keys). `{p}` is the
deployment's prefix (settings.redis.key_prefix); RQ's own keys live under `rq:` (tickets,
registries, workers), and the queue's fair-dispatch keys under `{p}:q:`.

Tenant namespaces: every key that holds one tenant's data lives under `{p}:t:`, as `t:{kind}:{tenant}`
and then its own parts, and no other key starts with `t:`. A tenant name has no `:`, so the tenant
always sits at the same segment after a fixed kind: no tenant name can spell a shared key (`runs:active`,
`schedules:due`) or another tenant's key, whatever it is (tests/unit/test_key_schema.py enumerates the
schema to prove it). Two families keep their own namespace, each with the tenant at a fixed place no
shared key fills: `secret:{tenant}:{host}` (written by the operator only; tenant `*` is everyone's)
and the queue's `q:{queue}:pending:{tenant}`. Data stored under the older layout (the same keys
without `t:`) is moved by `execbox.core.keymigration`, run at API start and by `execbox migrate`.

Longer than 400 lines because the schema is one table, every key with its type, lifetime and roles
in one place, next to the one class that names them.

Roles: api, worker, egress, admin, scaler (execbox.core.redis_roles). "write" below means the
role creates or changes the key; "read" that it only reads it.

Longer than 400 lines because it is the whole schema in one place, each key described where its name
is built, so that the roles, the namespace test and the reader see every key together.
"""

from __future__ import annotations

from dataclasses import dataclass

TENANT_SPACE = "t"
"""The first segment (after the prefix) of every tenant's key, and of no other key."""


@dataclass(frozen=True)
class KeySpec:
    pattern: str
    """The key after `{p}:`, with `{...}` for its variable parts."""
    type: str
    ttl: str
    write: tuple[str, ...]
    read: tuple[str, ...]
    what: str


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
        "running", "set of ids", "none", ("api", "worker"), (), "executions running now, for the lost-worker sweep"
    ),
    KeySpec(
        "lease:{id}",
        "string (worker name)",
        "worker.lease_s, renewed",
        ("worker", "api"),
        (),
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
    KeySpec("due:{name}", "zset member -> due time", "none", ("worker",), (), "delayed work (webhook retries)"),
    KeySpec(
        "file:{id}",
        "hash (meta, data)",
        "file ttl, extended by executions using it",
        ("api",),
        ("worker",),
        "an uploaded or inline input file",
    ),
    KeySpec("t:rate:{tenant}:{minute}", "string counter", "120 s", ("api",), (), "submissions in a tenant's minute"),
    KeySpec(
        "t:active:{tenant}",
        "zset id -> admission time",
        "none",
        ("api", "worker"),
        (),
        "a tenant's queued or running executions (its running quota)",
    ),
    KeySpec(
        "worker:{name}",
        "string (JSON heartbeat)",
        "3 heartbeats",
        ("worker",),
        ("api",),
        "a live worker: engine health, missing images, runtimes",
    ),
    KeySpec("q:{queue}:ring", "list of tenants", "none", ("api", "worker"), (), "fair dispatch: tenants in turn"),
    KeySpec("q:{queue}:ring:members", "set of tenants", "none", ("api", "worker"), (), "tenants on the ring"),
    KeySpec("q:{queue}:pending:{tenant}", "list of ids", "none", ("api", "worker"), (), "a tenant's queued entries"),
    KeySpec("apikey:{digest}", "string (JSON)", "none", ("api", "admin"), (), "an API key, by its SHA-256"),
    KeySpec("apikeys", "set of digests", "none", ("api", "admin"), (), "every API key, for listing"),
    KeySpec(
        "t:idem:{tenant}:{route}:{key}",
        "string (JSON) + pub/sub",
        "api.idempotency_ttl_s",
        ("api",),
        (),
        "an Idempotency-Key's claim, then its answer",
    ),
    KeySpec(
        "egress:rule:{address}",
        "string (JSON EgressRule)",
        "the run's timeout + margin",
        ("worker",),
        ("egress",),
        "what the run whose network the proxy has this address on may reach",
    ),
    KeySpec(
        "egress:slot:{subnet}",
        "string (execution id | cooling)",
        "the run, then slot_cooldown_s",
        ("worker",),
        (),
        "a per-run /28, reserved while used and cooling down after",
    ),
    KeySpec(
        "egress:denied:{id}",
        "list of JSON",
        "retention_s",
        ("egress",),
        ("api", "worker"),
        "the proxy's refusals for an execution (first 100)",
    ),
    KeySpec(
        "secret:{tenant}:{host}",
        "hash header -> JSON {sealed, tls}",
        "none",
        ("admin",),
        ("egress",),
        "secret headers sealed to the egress proxy's key (tenant `*`: everyone's)",
    ),
    KeySpec("uid:{uid}", "string", "4 h", ("worker",), (), "a sandbox uid held by a live container"),
    KeySpec(
        "live:{id}",
        "stream of live events",
        "retention_s; ~2,000 entries",
        ("worker", "api"),
        (),
        "an execution's stdout, stderr, result and status events as they happen (SSE)",
    ),
    KeySpec(
        "ses:{id}",
        "string (JSON SessionRecord)",
        "retention_s after the last write",
        ("api", "worker"),
        (),
        "a session; every status change is a compare-and-set",
    ),
    KeySpec("ses:{id}:cells", "list of execution ids", "retention_s", ("api", "worker"), (), "a session's queue"),
    KeySpec(
        "ses:{id}:lease", "string (worker name)", "worker.lease_s, renewed", ("worker",), ("api",), "the holder's lease"
    ),
    KeySpec("t:ses:tenant:{tenant}", "zset id -> created_at", "none", ("api", "worker"), (), "a tenant's sessions"),
    KeySpec("t:ses:open:{tenant}", "zset id -> created_at", "none", ("api", "worker"), (), "open sessions (the quota)"),
    KeySpec("ses:live", "zset id -> created_at", "none", ("api", "worker"), (), "sessions not ended, for the reaper"),
    KeySpec("ses:starts:{queue}", "list of ids", "none", ("api", "worker"), (), "sessions waiting for a worker"),
    KeySpec(
        "run:{id}",
        "string (JSON RunRecord)",
        "retention_s after the last write",
        ("api",),
        ("worker",),
        "a plan's run: its steps' states, budgets and events; written under the run's lock",
    ),
    KeySpec("runlock:{id}", "string (lock token)", "30 s", ("api",), (), "serialises advancing one run"),
    KeySpec("t:runs:{tenant}", "zset id -> created_at", "none", ("api",), (), "a tenant's runs, for listing"),
    KeySpec("runs:active", "zset id -> next due time", "none", ("api",), (), "runs with a retry, expiry or budget due"),
    KeySpec("approval:{id}", "string (JSON approval)", "retention_s", ("api",), ("worker",), "a step's approval"),
    KeySpec("t:approvals:{tenant}", "zset id -> requested_at", "none", ("api",), (), "a tenant's approvals"),
    KeySpec(
        "t:script:{tenant}:{name}",
        "hash version -> JSON ScriptVersion",
        "none",
        ("api",),
        (),
        "a script's versions (immutable but for status and evidence)",
    ),
    KeySpec(
        "t:scriptuse:{tenant}:{name}", "hash version -> count", "none", ("api",), (), "executions started per version"
    ),
    KeySpec("t:scripts:{tenant}", "set of names", "none", ("api",), (), "a tenant's scripts, for search"),
    KeySpec("schedule:{id}", "string (JSON Schedule)", "none", ("api",), (), "a schedule"),
    KeySpec("t:schedules:{tenant}", "zset id -> created_at", "none", ("api",), (), "a tenant's schedules"),
    KeySpec("schedules:due", "zset id -> next look", "none", ("api",), (), "when each schedule needs its scheduler"),
    KeySpec("firings:{id}", "list of JSON firings", "last 1000", ("api",), (), "a schedule's firings"),
    KeySpec("slot:{id}:{slot}", "string", "7 days", ("api",), (), "the claim that fires a slot once"),
    KeySpec(
        "t:surprises:{tenant}",
        "stream of JSON events",
        "~10,000 entries",
        ("api",),
        (),
        "failed script executions (GET /v1/events)",
    ),
    KeySpec(
        "surprise:{id}",
        "string (JSON event + webhook)",
        "retention_s",
        ("api",),
        ("worker",),
        "a failed scheduled execution's event, for its schedule's webhook",
    ),
    # background loops (execbox.core.poison): what they set aside, what an operator hands back, failed attempts
    KeySpec("dead:{loop}", "stream of dead letters", "~10,000", ("api", "worker", "admin"), (), "items set aside"),
    KeySpec("replay:{loop}", "list of dead letters", "none", ("api", "worker", "admin"), (), "replays to put back"),
    KeySpec("poison:{loop}:{digest}", "string counter", "1 day", ("api", "worker"), (), "an item's failed attempts"),
)


class Keys:
    """Key names for one deployment (prefix)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _t(self, kind: str, tenant: str, *parts: str) -> str:
        """A key of one tenant's: under `t:`, where no shared key lives, with the tenant after its kind."""
        return self._k(TENANT_SPACE, kind, tenant, *parts)

    def tenant_keys(self, kind: str) -> str:
        """A SCAN match for one kind of key across every tenant, e.g. tenant_keys("active") -> "p:t:active:*"."""
        return self._k(TENANT_SPACE, kind, "*")

    def pattern(self, kind: str) -> str:
        """A SCAN match for every key of one kind, e.g. pattern("worker") -> "p:worker:*"."""
        return self._k(kind, "*")

    # executions
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

    def due(self, name: str) -> str:
        return self._k("due", name)

    def stream(self, execution_id: str) -> str:
        return self._k("live", execution_id)

    # sessions
    def session(self, session_id: str) -> str:
        return self._k("ses", session_id)

    def session_cells(self, session_id: str) -> str:
        return self._k("ses", session_id, "cells")

    def session_lease(self, session_id: str) -> str:
        return self._k("ses", session_id, "lease")

    def sessions_of(self, tenant: str) -> str:
        return self._t("ses:tenant", tenant)

    def open_sessions(self, tenant: str) -> str:
        return self._t("ses:open", tenant)

    @property
    def live_sessions(self) -> str:
        return self._k("ses", "live")

    def session_starts(self, queue: str) -> str:
        return self._k("ses", "starts", queue)

    # files
    def file(self, file_id: str) -> str:
        return self._k("file", file_id)

    # tenancy
    def rate(self, tenant: str, minute: int) -> str:
        return self._t("rate", tenant, str(minute))

    def active(self, tenant: str) -> str:
        return self._t("active", tenant)

    def api_key(self, digest: str) -> str:
        return self._k("apikey", digest)

    @property
    def api_keys(self) -> str:
        return self._k("apikeys")

    def idempotency(self, tenant: str, route: str, key: str) -> str:
        return self._t("idem", tenant, route, key)

    # the fleet and the queue
    def worker(self, name: str) -> str:
        return self._k("worker", name)

    def queue(self, queue: str) -> tuple[str, str, str]:
        """Fair dispatch of one queue: the ring of tenants, its member set, the prefix of the pending lists."""
        base = self._k("q", queue)
        return f"{base}:ring", f"{base}:ring:members", f"{base}:pending:"

    # egress and sandboxes
    def egress_rule(self, address: str) -> str:
        return self._k("egress", "rule", address)

    def egress_slot(self, subnet: str) -> str:
        return self._k("egress", "slot", subnet)

    def egress_denied(self, execution_id: str) -> str:
        return self._k("egress", "denied", execution_id)

    def secret(self, tenant: str, host: str) -> str:
        return self._k("secret", f"{tenant}:{host}")

    def uid(self, uid: int) -> str:
        return self._k("uid", str(uid))

    # scripts
    def script(self, tenant: str, name: str) -> str:
        return self._t("script", tenant, name)

    def script_use(self, tenant: str, name: str) -> str:
        return self._t("scriptuse", tenant, name)

    def scripts(self, tenant: str) -> str:
        return self._t("scripts", tenant)

    # schedules
    def schedule(self, schedule_id: str) -> str:
        return self._k("schedule", schedule_id)

    def schedules(self, tenant: str) -> str:
        return self._t("schedules", tenant)

    @property
    def schedules_due(self) -> str:
        return self._k("schedules", "due")

    def firings(self, schedule_id: str) -> str:
        return self._k("firings", schedule_id)

    def slot(self, schedule_id: str, slot: str) -> str:
        return self._k("slot", schedule_id, slot)

    def surprises(self, tenant: str) -> str:
        return self._t("surprises", tenant)

    def surprise(self, execution_id: str) -> str:
        return self._k("surprise", execution_id)

    # plans
    def run(self, run_id: str) -> str:
        return self._k("run", run_id)

    def run_lock(self, run_id: str) -> str:
        return self._k("runlock", run_id)

    def runs(self, tenant: str) -> str:
        return self._t("runs", tenant)

    @property
    def active_runs(self) -> str:
        return self._k("runs", "active")

    def approval(self, approval_id: str) -> str:
        return self._k("approval", approval_id)

    def approvals(self, tenant: str) -> str:
        return self._t("approvals", tenant)

    # background loops (execbox.core.poison)
    def dead_letters(self, loop: str) -> str:
        return self._k("dead", loop)

    def replays(self, loop: str) -> str:
        return self._k("replay", loop)

    def poison(self, loop: str, digest: str) -> str:
        return self._k("poison", loop, digest)
