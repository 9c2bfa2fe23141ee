"""The key builder: how a key is named, the row that describes it, and the background loops' own keys.

The Redis key schema is the real interface between the API, the workers and the egress proxy. Each
room names its own keys in its `keys.py`: a `SCHEMA` of `KeySpec` rows (type, lifetime, the roles
that write and read it) and a `KeyBuilder` subclass with one method per key, so a store builds its
keys in its own room and nowhere else. `execbox.keyschema` assembles the rooms' tables into the
whole schema and their classes into the `Keys` each process builds once; docs/architecture.md's
key table is generated from it. `{p}` is the deployment's prefix (settings.redis.key_prefix);
RQ's own keys live under `rq:`.

Tenant namespaces: every key that holds one tenant's data lives under `{p}:t:`, as `t:{kind}:{tenant}`
and then its own parts (`KeyBuilder._t`), and no other key starts with `t:`. A tenant name has no `:`,
so the tenant always sits at the same segment after a fixed kind: no tenant name can spell a shared
key (`runs:active`, `schedules:due`) or another tenant's key (tests/unit/test_key_schema.py enumerates
the schema to prove it). Two families keep their own namespace, each with the tenant at a fixed place
no shared key fills: `secret:{tenant}:{host}` and the queue's `q:{queue}:pending:{tenant}`. Data
stored under the older layout is moved by `execbox.core.keymigration`.

Roles: api, worker, egress, admin, scaler (execbox.core.redis_roles). "write" in a row means the
role creates or changes the key; "read" that it only reads it. The rows are the Redis ACL's source:
each role is granted the patterns of the rows that name it (`KeySpec.glob`), and nothing else.
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
    write_only: tuple[str, ...] = ()
    """Roles among `write` that never read it (the egress proxy appending refusals): granted write only."""

    @property
    def glob(self) -> str:
        """The ACL pattern after `{p}:`: the key up to its first variable part, then `*`."""
        fixed, variable, _ = self.pattern.partition("{")
        return f"{fixed}*" if variable else fixed

    @property
    def is_key(self) -> bool:
        return not self.type.startswith("pub/sub")

    @property
    def is_channel(self) -> bool:
        """A pub/sub channel (`pub/sub channel`), or a key published on too (`... + pub/sub`)."""
        return "pub/sub" in self.type


class KeyBuilder:
    """Key names for one deployment (prefix); each room's key class adds its own keys."""

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


LOOP_SCHEMA: tuple[KeySpec, ...] = (
    KeySpec("dead:{loop}", "stream of dead letters", "~10,000", ("api", "worker", "admin"), (), "items set aside"),
    KeySpec("replay:{loop}", "list of dead letters", "none", ("api", "worker", "admin"), (), "replays to put back"),
    KeySpec("poison:{loop}:{digest}", "string counter", "1 day", ("api", "worker"), (), "an item's failed attempts"),
)
"""The keys of every process's background loops (execbox.core.poison): what they set aside, what an
operator hands back, failed attempts."""


MOVED_KINDS = ("rate", "active", "idem", "runs", "approvals", "script", "scriptuse", "scripts", "schedules",
               "surprises", "ses:tenant", "ses:open")  # fmt: skip
"""The families that moved under `t:` (execbox.core.keymigration), as they were named before."""

LEGACY_SCHEMA: tuple[KeySpec, ...] = tuple(
    KeySpec(
        f"{kind}:{{tenant}}", "as before tenant namespaces", "as before", ("api",), (), "moved under `t:` at API start"
    )
    for kind in MOVED_KINDS
)
"""The keys of the layout before tenant namespaces, which only the API's move (execbox.core.keymigration)
touches; nothing writes them any more. Not part of the key schema, but granted by the ACL."""


class LoopKeys(KeyBuilder):
    def dead_letters(self, loop: str) -> str:
        return self._k("dead", loop)

    def replays(self, loop: str) -> str:
        return self._k("replay", loop)

    def poison(self, loop: str, digest: str) -> str:
        return self._k("poison", loop, digest)


__all__ = ["LEGACY_SCHEMA", "LOOP_SCHEMA", "MOVED_KINDS", "TENANT_SPACE", "KeyBuilder", "KeySpec", "LoopKeys"]
