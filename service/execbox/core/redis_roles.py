"""Least-privilege Redis: one ACL user per component role, limited to its keys and commands.

Every component holds only its own role's password, so a compromised component reaches no
further in Redis than its role: the egress proxy (which parses sandbox traffic) can read the
egress rules and sealed secrets and append refusals, nothing else; the API can queue work but not
read egress rules or secrets; a worker cannot read API keys, idempotency records or secrets; no
role can run administrative commands (CONFIG, ACL, FLUSHALL, MONITOR, DEBUG, KEYS, ...). Nobody
can log in as the `default` user (it is off), so a connection without credentials can do nothing.

A role's keys and channels are derived from the key schema's rows (`KeySpec`: the roles that write
and read each key), so a room that adds a key names its roles in its own row and nowhere else; a key
no row gives a role is invisible to it. The rows reach this module from the assembly
(`execbox.keyschema` hands them over when imported; core imports no room). Written by hand here:
each role's commands, and RQ's own keys and channels (under `rq:`, outside the prefix).
`%R~` grants read only, `%W~` write only (Redis 7 key permissions).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from execbox.core.keys import LEGACY_SCHEMA, KeySpec

ROLES = ("api", "worker", "egress", "admin", "scaler")

# Data commands by category; the dangerous and administrative ones are taken away again, and the
# few read-only introspection commands RQ needs (server version, connection name) given back.
_DATA = (
    "+@read +@write +@keyspace +@string +@list +@hash +@set +@sortedset +@transaction +@scripting "
    "+@connection +@blocking +@stream -@dangerous -@admin +info +client|setname +client|getname +client|info +client|id"
)
_PUBSUB = "+subscribe +unsubscribe +psubscribe +punsubscribe +publish +ping"


@dataclass(frozen=True)
class Role:
    name: str
    keys: tuple[str, ...]
    channels: tuple[str, ...]
    commands: str

    def acl_line(self, password: str) -> str:
        digest = hashlib.sha256(password.encode()).hexdigest()
        parts = ["user", self.name, "on", f"#{digest}", "resetkeys", *self.keys, "resetchannels",
                 *(f"&{c}" for c in self.channels), "-@all", self.commands]  # fmt: skip
        return " ".join(parts)


_COMMANDS = {
    # Accepts and reads executions, files, keys, idempotency records, quotas; queues tickets; runs plans.
    "api": f"{_DATA} {_PUBSUB}",
    # Runs executions; reads input files, and runs, approvals and failed scheduled executions (to
    # deliver their webhooks).
    "worker": f"{_DATA} {_PUBSUB}",
    # Reads rules and sealed secrets, appends refusals. Nothing else, not even a scan.
    "egress": "+get +hgetall +rpush +ltrim +expire +multi +exec +discard +ping +client|setname",
    # The operator's CLI: API keys, (sealed) secret headers, the loops' dead letters (a replay is
    # queued for the loop to put back), the nodes' drain marks and what `execbox nodes list` reads.
    "admin": "+@read +@write +@keyspace +@string +@hash +@set +@list +@stream +@transaction +@connection "
    "-@dangerous -@admin",
    # An autoscaler (KEDA) reading the queue's length.
    "scaler": "+llen +ping +client|setname",
}
_RQ_KEYS = {"api": ("~rq:*",), "worker": ("~rq:*",), "scaler": ("%R~rq:queue:*",)}
_RQ_CHANNELS = {"worker": ("rq:pubsub:*",)}

_schema: tuple[KeySpec, ...] = ()


def use_schema(schema: Iterable[KeySpec]) -> None:
    """The deployment's key rows, handed over by the assembly (`execbox.keyschema`) for `roles` and
    `acl_file` to derive from when not given theirs."""
    global _schema
    _schema = tuple(schema)


def _rights(spec: KeySpec, role: str) -> set[str]:
    wants = set()
    if role in spec.write:
        wants |= {"W"} if role in spec.write_only else {"R", "W"}
    if role in spec.read:
        wants.add("R")
    return wants


def _grants(prefix: str, schema: Iterable[KeySpec], role: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The key and channel patterns of the rows naming `role`: the rows' own, each with the rights its
    rows give (read, write or both), less those a pattern granted before already covers; then the
    families of the layout before tenant namespaces that none of them covers."""
    rights: dict[str, set[str]] = {}
    channels: dict[str, None] = {}
    for spec in (*schema, *LEGACY_SCHEMA):
        wants = _rights(spec, role)
        if not wants:
            continue
        if spec.is_channel:
            channels[f"{prefix}:{spec.glob}"] = None
        if not spec.is_key:
            continue
        covered = any(
            held >= wants and glob.endswith("*") and glob != spec.glob and spec.glob.startswith(glob[:-1])
            for glob, held in rights.items()
        )
        if spec.glob in rights or not covered:
            rights.setdefault(spec.glob, set()).update(wants)
    marks = {frozenset("RW"): "~", frozenset("R"): "%R~", frozenset("W"): "%W~"}
    keys = tuple(f"{marks[frozenset(held)]}{prefix}:{glob}" for glob, held in rights.items())
    return (*keys, *_RQ_KEYS.get(role, ())), (*channels, *_RQ_CHANNELS.get(role, ()))


def roles(prefix: str, schema: Iterable[KeySpec] | None = None) -> dict[str, Role]:
    """Each role's grants for the deployment's prefix, from `schema` (by default the assembled one)."""
    rows = tuple(_schema if schema is None else schema)
    if not rows:
        raise RuntimeError("no key schema to derive the Redis roles from: import execbox.keyschema, or pass its SCHEMA")
    unknown = {role for spec in rows for role in (*spec.write, *spec.read)} - set(ROLES)
    if unknown:
        raise ValueError(
            f"key rows name unknown role(s) {', '.join(sorted(unknown))}; the roles are {', '.join(ROLES)}"
        )
    return {name: Role(name, *_grants(prefix, rows, name), _COMMANDS[name]) for name in ROLES}


def acl_file(prefix: str, passwords: Mapping[str, str], schema: Iterable[KeySpec] | None = None) -> str:
    """The ACL file for a deployment: each role with its password (stored as a SHA-256 digest, so
    the file holds no password); the default user switched off. The roles' patterns come from
    `schema`, by default the one `execbox.keyschema` assembled.

    The default user keeps every permission although nobody can authenticate as it: Redis replays
    the append-only file as the default user and, up to 7.2, re-checks its permissions at each
    replayed EXEC, so a restricted default user silently drops every transaction on restart
    (redis/redis#14541, fixed by #14545; Debian 12 ships 7.0.15). `off` alone keeps it unusable.
    """
    missing = [r for r in ROLES if not passwords.get(r)]
    if missing:
        raise ValueError(f"no password for role(s) {', '.join(missing)}")
    lines = ["user default off resetpass resetkeys ~* resetchannels &* +@all"]
    lines += [role.acl_line(passwords[name]) for name, role in roles(prefix, schema).items()]
    return "\n".join(lines) + "\n"


def role_url(url: str, role: str, password: str) -> str:
    """`url` (a redis:// DSN) with this role's credentials in place of any it carries."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"))


__all__ = ["ROLES", "Role", "acl_file", "role_url", "roles", "use_schema"]
