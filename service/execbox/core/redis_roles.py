"""Least-privilege Redis: one ACL user per component role, limited to its keys and commands.

Every component holds only its own role's password, so a compromised component reaches no
further in Redis than its role: the egress proxy (which parses sandbox traffic) can read the
egress rules and sealed secrets and append refusals, nothing else; the API can queue work but not
read egress rules or secrets; a worker cannot read API keys, idempotency records or secrets; no
role can run administrative commands (CONFIG, ACL, FLUSHALL, MONITOR, DEBUG, KEYS, ...). Nobody
can log in as the `default` user (it is off), so a connection without credentials can do nothing.

The key schema is assembled in `execbox.keyschema` from each room's `keys` (prefix `p`, RQ's own
keys under `rq:`). Patterns here name those keys; a key a role does not name is invisible to it.
`%R~` grants read only, `%W~` write only (Redis 7 key permissions).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

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


def roles(prefix: str) -> dict[str, Role]:
    p = prefix
    shared = (f"~{p}:exe:*", f"~{p}:deadlines", f"~{p}:running", f"~{p}:lease:*", f"~{p}:cancel:*",
              f"~{p}:t:active:*", f"~{p}:worker:*", f"~{p}:q:*", f"%R~{p}:egress:denied:*", "~rq:*",
              f"~{p}:t:kept:*", f"~{p}:events", f"~{p}:ses:*", f"~{p}:t:ses:*", f"~{p}:live:*",
              # every process's background loops: their dead letters, replays and failure counts
              f"~{p}:dead:*", f"~{p}:replay:*", f"~{p}:poison:*")  # fmt: skip
    # The API moves data stored under the layout before tenant namespaces (execbox.core.keymigration):
    # the same families without `t:`. Nothing writes them any more.
    legacy = tuple(f"~{p}:{kind}:*" for kind in ("rate", "active", "idem", "runs", "approvals", "script",
                                                "scriptuse", "scripts", "schedules", "surprises"))  # fmt: skip
    return {
        # Accepts and reads executions, files, keys, idempotency records, quotas; queues tickets; runs plans.
        "api": Role(
            "api",
            (
                *shared,
                *legacy,
                f"~{p}:file:*",
                f"~{p}:t:rate:*",
                f"~{p}:t:runrate:*",
                f"~{p}:apikey:*",
                f"~{p}:apikeys",
                f"~{p}:console:*",
                f"~{p}:t:idem:*",
                f"~{p}:run:*",
                f"~{p}:runlock:*",
                f"~{p}:t:runs:*",
                f"~{p}:runs:active",
                f"~{p}:approval:*",
                f"~{p}:t:approvals:*",
                f"~{p}:t:script:*",
                f"~{p}:t:scriptuse:*",
                f"~{p}:t:scripts:*",
                f"~{p}:schedule:*",
                f"~{p}:t:schedules:*",
                f"~{p}:schedules:due",
                f"~{p}:firings:*",
                f"~{p}:slot:*",
                f"~{p}:t:surprises:*",
                f"~{p}:surprise:*",
                f"~{p}:nodes:drained",
                f"%R~{p}:nodes:finished",
                f"~{p}:e2b:*",
            ),
            (f"{p}:done:*", f"{p}:t:idem:*"),
            f"{_DATA} {_PUBSUB}",
        ),
        # Runs executions: records, leases, egress rules, network slots and sandbox uids; reads input files,
        # and runs, approvals and failed scheduled executions (to deliver their webhooks).
        "worker": Role(
            "worker",
            (
                *shared,
                f"%R~{p}:file:*",
                f"~{p}:egress:rule:*",
                f"~{p}:egress:slot:*",
                f"~{p}:uid:*",
                f"~{p}:due:*",
                f"%R~{p}:run:*",
                f"%R~{p}:approval:*",
                f"%R~{p}:surprise:*",
                f"%R~{p}:nodes:drained",
                f"~{p}:nodes:finished",
            ),
            (f"{p}:done:*", "rq:pubsub:*"),
            f"{_DATA} {_PUBSUB}",
        ),
        # Reads rules and sealed secrets, appends refusals. Nothing else, not even a scan.
        "egress": Role(
            "egress",
            (f"%R~{p}:egress:rule:*", f"%R~{p}:secret:*", f"%W~{p}:egress:denied:*"),
            (),
            "+get +hgetall +rpush +ltrim +expire +multi +exec +discard +ping +client|setname",
        ),
        # The operator's CLI: API keys, (sealed) secret headers, and the loops' dead letters (a replay
        # is queued for the loop to put back: the admin role reaches none of the loops' own keys); the
        # nodes' drain marks, and what `execbox nodes list` reads (heartbeats, running ids and their
        # leases' holders: names and ids, never a record).
        "admin": Role(
            "admin",
            (
                f"~{p}:apikey:*",
                f"~{p}:apikeys",
                f"~{p}:secret:*",
                f"~{p}:dead:*",
                f"~{p}:replay:*",
                f"~{p}:nodes:drained",
                f"%R~{p}:nodes:finished",
                f"%R~{p}:worker:*",
                f"%R~{p}:running",
                f"%R~{p}:lease:*",
            ),  # fmt: skip
            (),
            "+@read +@write +@keyspace +@string +@hash +@set +@list +@stream +@transaction +@connection "
            "-@dangerous -@admin",
        ),
        # An autoscaler (KEDA) reading the queue's length.
        "scaler": Role("scaler", ("%R~rq:queue:*",), (), "+llen +ping +client|setname"),
    }


def acl_file(prefix: str, passwords: Mapping[str, str]) -> str:
    """The ACL file for a deployment: each role with its password (stored as a SHA-256 digest, so
    the file holds no password); the default user switched off.

    The default user keeps every permission although nobody can authenticate as it: Redis replays
    the append-only file as the default user and, up to 7.2, re-checks its permissions at each
    replayed EXEC, so a restricted default user silently drops every transaction on restart
    (redis/redis#14541, fixed by #14545; Debian 12 ships 7.0.15). `off` alone keeps it unusable.
    """
    missing = [r for r in ROLES if not passwords.get(r)]
    if missing:
        raise ValueError(f"no password for role(s) {', '.join(missing)}")
    lines = ["user default off resetpass resetkeys ~* resetchannels &* +@all"]
    lines += [role.acl_line(passwords[name]) for name, role in roles(prefix).items()]
    return "\n".join(lines) + "\n"


def role_url(url: str, role: str, password: str) -> str:
    """`url` (a redis:// DSN) with this role's credentials in place of any it carries."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"))


__all__ = ["ROLES", "Role", "acl_file", "role_url", "roles"]
