"""The plans room's Redis keys: runs, their lock and indexes, approvals."""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.library.keys import ScriptKeys
from execbox.sessions.keys import SessionKeys

LOOPS: tuple[str, ...] = ("plans",)
"""The background loop this room runs (the plan consumer, in every API process): its `loop`
label, its dead letters (`execbox.keyschema.LOOPS` gathers every room's)."""

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "run:{id}",
        "string (JSON StoredRun)",
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
)


class PlanKeys(ScriptKeys, SessionKeys):
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


__all__ = ["LOOPS", "SCHEMA", "PlanKeys"]
