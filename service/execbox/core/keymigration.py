"""Moving data stored before tenant namespaces into them: `{p}:{kind}:{tenant}...` becomes `{p}:t:{kind}:{tenant}...`.

Before tenant namespaces, a tenant's keys sat beside the shared ones, so a tenant named `active` or
`due` shared its list of runs or schedules with the shared index of that name (`runs:active`,
`schedules:due`). The move renames each old key (RENAMENX keeps its expiry) or, when a key of the new
name exists already (written since the upgrade), merges the old one into it. The two shared indexes
stay where they are; the runs and schedules of a tenant named `active` or `due` that sat in them are
also listed under the tenant's own new key. Running it again finds nothing more to do, so every API
process runs it at start, and `execbox migrate` runs it on demand.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import redis

from execbox.core.errors import ServiceError
from execbox.core.keys import MOVED_KINDS, TENANT_SPACE, LoopKeys
from execbox.core.redis import redis_errors, text

log = logging.getLogger(__name__)

SHARED_INDEXES = {"runs:active": ("run", "runs"), "schedules:due": ("schedule", "schedules")}
"""Shared keys that a tenant of the same name also used -> (the kind of their records, of the tenant's list)."""


@dataclass
class Migration:
    moved: int = 0
    merged: int = 0
    untangled: int = 0
    """Members of a shared index that belonged to a tenant of the index's name, now listed as its own."""


def migrate(client: redis.Redis, keys: LoopKeys) -> Migration:
    """Move every key of the old layout under the tenant namespace; safe to run at any time, and again."""
    done = Migration()
    head = f"{keys.prefix}:"
    with redis_errors():
        for name in client.scan_iter(match=f"{head}*", count=1000):
            old = text(name)
            rest = old.removeprefix(head)
            if rest.startswith(f"{TENANT_SPACE}:") or rest in SHARED_INDEXES:
                continue
            if not any(rest.startswith(f"{kind}:") for kind in MOVED_KINDS):
                continue
            new = f"{head}{TENANT_SPACE}:{rest}"
            if client.renamenx(old, new):
                done.moved += 1
            else:
                _merge(client, old, new)
                done.merged += 1
        for index, (record_kind, list_kind) in SHARED_INDEXES.items():
            done.untangled += _untangle(client, keys, index, record_kind, list_kind)
    if done.moved or done.merged or done.untangled:
        log.info("key layout: moved %d keys under %s:, merged %d, listed %d shared-index members as their tenant's",
                 done.moved, TENANT_SPACE, done.merged, done.untangled)  # fmt: skip
    return done


def migrate_at_start(client: redis.Redis, keys: LoopKeys) -> None:
    """migrate(), for a process starting up: Redis not answering yet is logged, not fatal (the next
    start, or `execbox migrate`, moves what is left)."""
    try:
        migrate(client, keys)
    except ServiceError as exc:
        log.error("key layout not checked (%s); run `execbox migrate` once Redis answers", exc.message)


def _merge(client: redis.Redis, old: str, new: str) -> None:
    """Both names exist: keep what the new key holds and add what only the old one had."""
    kind = text(client.type(old))
    if kind == "zset":
        pairs: Any = client.zrange(old, 0, -1, withscores=True)
        scored = {member: float(score) for member, score in pairs}
        if scored:
            client.zadd(new, scored, nx=True)
    elif kind == "set":
        members: Any = client.smembers(old)
        if members:
            client.sadd(new, *members)
    elif kind == "hash":
        for key, value in client.hgetall(old).items():
            client.hsetnx(new, key, value)
    elif kind == "stream":
        entries: Any = client.xrange(old)
        for _, fields in entries:
            client.xadd(new, fields)
    # a string (a rate counter, an idempotency record): the newer one stands
    client.delete(old)


def _untangle(client: redis.Redis, keys: LoopKeys, index: str, record_kind: str, list_kind: str) -> int:
    """List under the tenant's own key the members of a shared index that belong to a tenant of that name."""
    tenant = index.split(":")[1]
    ids = [text(i) for i in client.zrange(f"{keys.prefix}:{index}", 0, -1)]
    raws = client.mget([f"{keys.prefix}:{record_kind}:{i}" for i in ids]) if ids else []
    owned: dict[str, float] = {}
    for member, raw in zip(ids, raws, strict=True):
        try:
            record = json.loads(raw) if raw is not None else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("tenant") == tenant:
            created = record.get("created_at")
            owned[member] = float(created) if isinstance(created, int | float) else 0.0
    if not owned:
        return 0
    added: Any = client.zadd(f"{keys.prefix}:{TENANT_SPACE}:{list_kind}:{tenant}", dict(owned), nx=True)
    return int(added)


__all__ = ["MOVED_KINDS", "Migration", "migrate", "migrate_at_start"]
