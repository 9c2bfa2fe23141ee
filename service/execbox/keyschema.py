"""The whole Redis key schema, assembled from the rooms' own tables, and the `Keys` every process builds once.

It sits above the rooms and below the entry points (pyproject's import-linter layers): a room names
its keys in its `keys.py`, and only this module sees them all. The API, the worker, the egress proxy
and the CLI build `Keys(prefix)`; a room's function asks for its own room's key class, which `Keys`
is. docs/architecture.md's key table is rendered from `SCHEMA` (`execbox.vocabulary`), and the Redis
roles' ACL patterns are derived from it (`execbox.core.redis_roles`, handed `SCHEMA` here).
"""

from __future__ import annotations

from execbox.core import redis_roles
from execbox.core.keys import LOOP_SCHEMA, KeySpec
from execbox.e2b import keys as e2b
from execbox.egress import keys as egress
from execbox.executions import keys as executions
from execbox.files import keys as files
from execbox.fleet import keys as fleet
from execbox.library import keys as library
from execbox.plans import keys as plans
from execbox.sandbox import keys as sandbox
from execbox.schedules import keys as schedules
from execbox.sessions import keys as sessions
from execbox.tenancy import keys as tenancy
from execbox.webhooks import keys as webhooks

ROOM_SCHEMAS: dict[str, tuple[KeySpec, ...]] = {
    "executions": executions.SCHEMA,
    "files": files.SCHEMA,
    "tenancy": tenancy.SCHEMA,
    "fleet": fleet.SCHEMA,
    "egress": egress.SCHEMA,
    "sandbox": sandbox.SCHEMA,
    "sessions": sessions.SCHEMA,
    "e2b": e2b.SCHEMA,
    "plans": plans.SCHEMA,
    "library": library.SCHEMA,
    "schedules": schedules.SCHEMA,
    "webhooks": webhooks.SCHEMA,
    "core": LOOP_SCHEMA,
}
"""Each room's keys, by the room that owns them (core: the background loops')."""

SCHEMA: tuple[KeySpec, ...] = tuple(spec for table in ROOM_SCHEMAS.values() for spec in table)

ROOM_LOOPS: dict[str, tuple[str, ...]] = {
    "plans": plans.LOOPS,
    "schedules": schedules.LOOPS,
    "webhooks": webhooks.LOOPS,
    "executions": executions.LOOPS,
    "sessions": sessions.LOOPS,
}
"""Each room's background loops, by the room that runs them."""

LOOPS: tuple[str, ...] = tuple(name for names in ROOM_LOOPS.values() for name in names)
"""Every background loop by name: the `loop` label's values and the dead-letter streams (each a
process's `Loops` may start, each listed and counted by `execbox dead-letters`)."""

redis_roles.use_schema(SCHEMA)  # the Redis ACL is derived from the rows; core imports no room to find them


class Keys(webhooks.WebhookKeys, plans.PlanKeys, schedules.ScheduleKeys, e2b.E2bKeys):
    """Key names for one deployment (prefix): every room's."""


__all__ = ["LOOPS", "ROOM_LOOPS", "ROOM_SCHEMAS", "SCHEMA", "Keys"]
