"""The Redis ACL derived from the key schema's rows grants each role what the hand-written lists of
execbox.core.redis_roles granted before (issue 45): the old lists are copied here as they were."""

from __future__ import annotations

from execbox.core.redis_roles import Role, roles
from execbox.keyschema import SCHEMA

_DATA = (
    "+@read +@write +@keyspace +@string +@list +@hash +@set +@sortedset +@transaction +@scripting "
    "+@connection +@blocking +@stream -@dangerous -@admin +info +client|setname +client|getname +client|info +client|id"
)
_PUBSUB = "+subscribe +unsubscribe +psubscribe +punsubscribe +publish +ping"


def listed_roles(prefix: str) -> dict[str, Role]:
    """The roles as written by hand before, verbatim."""
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


NARROWED = [
    # Heartbeats are written by workers only (fleet.registry.WorkerRegistry.report, called from the
    # worker's context and reaper); the API reads them (alive: SCAN + MGET), as the row says.
    "api keys: gained %R~p:worker:*",
    "api keys: lost ~p:worker:*",
    # The only keys under `t:ses:` are a tenant's sessions and its open ones (sessions.keys).
    "api keys: gained ~p:t:ses:open:*",
    "api keys: gained ~p:t:ses:tenant:*",
    "api keys: lost ~p:t:ses:*",
    "worker keys: gained ~p:t:ses:open:*",
    "worker keys: gained ~p:t:ses:tenant:*",
    "worker keys: lost ~p:t:ses:*",
]
"""Where the rows grant less than the lists did; nowhere do they grant more."""


def test_each_role_is_granted_what_it_was_granted_by_hand_or_less() -> None:
    old, new = listed_roles("p"), roles("p", SCHEMA)
    assert list(new) == list(old)
    differences = []
    for name in old:
        for part in ("keys", "channels"):
            before, after = set(getattr(old[name], part)), set(getattr(new[name], part))
            differences += [f"{name} {part}: lost {p}" for p in sorted(before - after)]
            differences += [f"{name} {part}: gained {p}" for p in sorted(after - before)]
        if new[name].commands != old[name].commands:
            differences.append(f"{name}: commands {new[name].commands!r}")
    assert sorted(differences) == sorted(NARROWED)
