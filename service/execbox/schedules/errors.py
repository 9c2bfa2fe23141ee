"""The schedules room's errors. Codes are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import NotFound


class ScheduleNotFound(NotFound):
    code = "schedule.not_found"
    noun = "schedule"


__all__ = ["ScheduleNotFound"]
