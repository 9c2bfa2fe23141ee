"""The webhooks room's Redis keys: delayed deliveries (retries).

Delivery reads executions, runs and surprises too, so its key class carries the plans' and schedules' keys.
"""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.plans.keys import PlanKeys
from execbox.schedules.keys import ScheduleKeys

LOOPS: tuple[str, ...] = ("webhooks",)
"""The background loop this room runs (delivery, in every worker): its `loop` label, its dead
letters (`execbox.keyschema.LOOPS` gathers every room's)."""

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec("due:{name}", "zset member -> due time", "none", ("worker",), (), "delayed work (webhook retries)"),
)


class WebhookKeys(PlanKeys, ScheduleKeys):
    def due(self, name: str) -> str:
        return self._k("due", name)


__all__ = ["LOOPS", "SCHEMA", "WebhookKeys"]
