"""The sessions room's Redis keys: the session record, its queue of cells, its holder's lease, the indexes."""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.executions.keys import ExecutionKeys

LOOPS: tuple[str, ...] = ("sessions",)
"""The background loop this room runs (the session host's intake, in every worker): its `loop`
label, its dead letters (`execbox.keyschema.LOOPS` gathers every room's)."""

SCHEMA: tuple[KeySpec, ...] = (
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
        "ses:{id}:asks",
        "list of JSON requests",
        "retention_s",
        ("api", "worker"),
        (),
        "file and process requests for the session's holder (execbox.sessions.ops)",
    ),
    KeySpec(
        "ses:{id}:answers:{op}",
        "list of JSON answers",
        "ANSWER_TTL_S (60 s) after the last",
        ("api", "worker"),
        (),
        "what the sandbox said to one request: a read's chunks, the reply, a process's output and end",
    ),
    KeySpec(
        "ses:{id}:bytes",
        "hash list name -> bytes",
        "retention_s; deleted when the session ends",
        ("api", "worker"),
        (),
        "bytes waiting in the session's asks and answer lists (their byte caps)",
    ),
    KeySpec(
        "ses:{id}:lease", "string (worker name)", "worker.lease_s, renewed", ("worker",), ("api",), "the holder's lease"
    ),
    KeySpec("t:ses:tenant:{tenant}", "zset id -> created_at", "none", ("api", "worker"), (), "a tenant's sessions"),
    KeySpec("t:ses:open:{tenant}", "zset id -> created_at", "none", ("api", "worker"), (), "open sessions (the quota)"),
    KeySpec("ses:live", "zset id -> created_at", "none", ("api", "worker"), (), "sessions not ended, for the reaper"),
    KeySpec("ses:starts:{queue}", "list of ids", "none", ("api", "worker"), (), "sessions waiting for a worker"),
)


class SessionKeys(ExecutionKeys):
    def session(self, session_id: str) -> str:
        return self._k("ses", session_id)

    def session_cells(self, session_id: str) -> str:
        return self._k("ses", session_id, "cells")

    def session_ops(self, session_id: str) -> str:
        return self._k("ses", session_id, "asks")

    def session_answers(self, session_id: str, op: str) -> str:
        return self._k("ses", session_id, "answers", op)

    def session_bytes(self, session_id: str) -> str:
        return self._k("ses", session_id, "bytes")

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


__all__ = ["LOOPS", "SCHEMA", "SessionKeys"]
