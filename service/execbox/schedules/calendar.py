"""A schedule's calendar: cron expressions in an IANA time zone, with croniter.

Five fields (minute hour day month weekday), or six with seconds last (`* * * * * */2`: every two
seconds). Slots are computed in the zone's wall time:

- a wall time that does not exist (the hour skipped when clocks go forward) fires at the first
  instant after the gap (02:30 on the night of the change fires at 03:00 in Europe/Oslo);
- a wall time that happens twice (the hour repeated when clocks go back) fires once, at its first
  occurrence.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter


class CalendarError(ValueError):
    pass


SAMPLE_SLOTS = 64
"""Slots looked at to find a calendar's shortest interval (a cron's gaps repeat within a day)."""


def check(cron: str, zone: str, min_interval_s: float = 0.0, now: float | None = None) -> None:
    """CalendarError naming what is wrong with the expression or the zone: not cron, a calendar
    that never fires (`0 0 31 2 *`), or firings closer together than `min_interval_s`."""
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CalendarError(f"unknown time zone {zone!r} (an IANA name such as Europe/Oslo)") from exc
    if not croniter.is_valid(cron):
        raise CalendarError(f"{cron!r} is not a cron expression (5 fields, or 6 with seconds last)")
    start = time.time() if now is None else now
    found: list[float] = []
    try:
        for slot in slots(cron, zone, start):
            found.append(slot)
            if len(found) >= SAMPLE_SLOTS:
                break
    except CroniterError as exc:
        raise CalendarError(f"{cron!r} never fires (no such date in the coming years)") from exc
    shortest = min((b - a for a, b in itertools.pairwise(found)), default=None)
    if shortest is not None and shortest < min_interval_s:
        raise CalendarError(f"{cron!r} fires every {shortest:g} s; this tenant's policy allows at most one "
                            f"firing every {min_interval_s:g} s (schedule_min_interval_s)")  # fmt: skip


def slots(cron: str, zone: str, after: float) -> Iterator[float]:
    """Unix times of the slots strictly after `after`, in order, without end."""
    tz = ZoneInfo(zone)
    start = datetime.fromtimestamp(after, UTC).astimezone(tz)
    previous_wall: datetime | None = None
    for moment in croniter(cron, start).all_next(datetime):
        wall = moment.replace(tzinfo=None)
        if wall == previous_wall:
            continue  # the repeated hour: once is enough
        previous_wall = wall
        yield moment.timestamp()


def due(cron: str, zone: str, after: float, until: float, limit: int = 1000) -> list[float]:
    """The slots in (after, until], at most `limit` (the most recent ones when there are more)."""
    found: list[float] = []
    for slot in slots(cron, zone, after):
        if slot > until:
            break
        found.append(slot)
        if len(found) > limit:
            found.pop(0)
    return found
