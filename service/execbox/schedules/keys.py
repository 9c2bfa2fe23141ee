"""The schedules room's Redis keys: schedules, their firings and slot claims, surprise events."""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.library.keys import ScriptKeys

LOOPS: tuple[str, ...] = ("scheduler", "surprises")
"""The background loops this room runs (the scheduler, the surprises of failed script runs):
their `loop` label, their dead letters (`execbox.keyschema.LOOPS` gathers every room's)."""

SCHEMA: tuple[KeySpec, ...] = (
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
)


class ScheduleKeys(ScriptKeys):
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


__all__ = ["LOOPS", "SCHEMA", "ScheduleKeys"]
