"""Schedules with a clock the test drives (no sleeping): the calendar across DST, every slot
fired once by two schedulers (one of them restarted), overlap and misfire policies."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.schedules import calendar
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.schemas import ScheduleCreate
from execbox.settings import Settings
from tests.conftest import wait_until
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]
T0 = datetime(2031, 1, 6, 7, 0, tzinfo=ZoneInfo("UTC")).timestamp()
"""A Monday far enough ahead that the app's own scheduler (on the real clock) never sees these slots."""


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def oslo(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> str:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo("Europe/Oslo")).isoformat()


def test_the_calendar_handles_both_dst_changes_in_oslo() -> None:
    def after(year: int, month: int, day: int, n: int = 3) -> list[str]:
        begin = datetime(year, month, day, tzinfo=ZoneInfo("Europe/Oslo")).timestamp()
        found = calendar.slots("30 2 * * *", "Europe/Oslo", begin)
        return [datetime.fromtimestamp(next(found), ZoneInfo("Europe/Oslo")).isoformat() for _ in range(n)]

    # Clocks go forward at 02:00 on 29 March 2026: 02:30 does not exist and fires at 03:00.
    assert after(2026, 3, 28) == [oslo(2026, 3, 28, 2, 30), oslo(2026, 3, 29, 3, 0), oslo(2026, 3, 30, 2, 30)]
    # They go back at 03:00 on 25 October: 02:30 happens twice and fires once.
    assert after(2026, 10, 24) == [oslo(2026, 10, 24, 2, 30), oslo(2026, 10, 25, 2, 30), oslo(2026, 10, 26, 2, 30)]
    with pytest.raises(calendar.CalendarError):
        calendar.check("61 * * * *", "UTC")
    with pytest.raises(calendar.CalendarError):
        calendar.check("* * * * *", "Mars/Olympus")


def setup(api: Api, client: redis.Redis, settings: Settings, **schedule: Any) -> tuple[Scheduler, Any, Clock]:
    http, as_ = api
    script = {"name": "tick", "version": "1.0.0", "code": "print(1)", "input_schema": {"type": "object"}}
    assert http.post("/v1/scripts", json=script, headers=as_["alpha"]).status_code == 201
    services = http.app.state.services
    clock = Clock(T0)
    scheduler = Scheduler(services.schedules.store, services.scripts, services.store, clock=clock)
    created = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * * *", **schedule))
    return scheduler, created, clock


def finish(client: redis.Redis, settings: Settings, execution_id: str) -> None:
    store = ExecutionStore(client, settings)
    store.transition(execution_id, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)
    store.transition(execution_id, {ExecutionStatus.RUNNING}, "test", lambda r: ExecutionStatus.SUCCEEDED)


def test_two_schedulers_and_a_restart_fire_each_of_20_slots_once(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    first, schedule, clock = setup(api, client, settings, overlap="queue_one")
    second = Scheduler(first.store, first.library, first.executions, clock=clock)
    for second_ in range(1, 21):
        clock.now = T0 + second_
        if second_ == 10:  # one scheduler restarts mid-run: a new instance with nothing in memory
            second = Scheduler(first.store, first.library, first.executions, clock=clock)
        for scheduler in (first, second) if second_ % 2 else (second, first):
            scheduler.tick()
        for firing in first.store.firings(schedule.id):
            if firing.execution_id:
                record = first.executions.get(firing.execution_id)
                if record is not None and not record.status.terminal:
                    finish(client, settings, firing.execution_id)

    firings = first.store.firings(schedule.id)
    assert [f.slot - T0 for f in firings] == [float(s) for s in range(1, 21)], "every slot once, in order"
    assert {f.status for f in firings} == {"fired"} and len({f.execution_id for f in firings}) == 20
    assert all(f.lag_s is not None and f.lag_s < 1 for f in firings)


def test_overlap_skips_or_queues_one_while_the_previous_firing_runs(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    scheduler, skipping, clock = setup(api, client, settings)
    queueing = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * * *", overlap="queue_one"))
    for second in (1, 2, 3):
        clock.now = T0 + second
        scheduler.tick()
    assert [f.status for f in scheduler.store.firings(skipping.id)] == ["fired", "skipped_overlap", "skipped_overlap"]
    assert [f.status for f in scheduler.store.firings(queueing.id)] == ["fired", "queued", "skipped_overlap"]

    finish(client, settings, scheduler.store.firings(queueing.id)[0].execution_id or "")
    clock.now = T0 + 3.5
    scheduler.tick()
    statuses = [(f.slot - T0, f.status) for f in scheduler.store.firings(queueing.id)]
    assert statuses[-1] == (2.0, "fired"), "the queued slot fires once the running one ends"


def test_after_a_downtime_missed_slots_are_skipped_or_the_latest_fired_once(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    scheduler, skipping, clock = setup(api, client, settings, misfire_grace_s=5)
    latest = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * * */10",
                                                      misfire="fire_latest", misfire_grace_s=5))  # fmt: skip
    clock.now = T0 + 60  # a minute of downtime: every slot but the last few seconds is late

    scheduler.tick()

    skipped = [(f.slot - T0, f.status) for f in scheduler.store.firings(skipping.id)]
    assert skipped[:54] == [(float(s), "skipped_misfire") for s in range(1, 55)], "more than 5 s late: skipped"
    assert skipped[54:] == [(55.0, "fired")] + [(float(s), "skipped_overlap") for s in range(56, 61)]
    fired = [(f.slot - T0, f.status) for f in scheduler.store.firings(latest.id)]
    assert fired == [(10.0, "skipped_misfire"), (20.0, "skipped_misfire"), (30.0, "skipped_misfire"),
                     (40.0, "skipped_misfire"), (50.0, "skipped_misfire"), (60.0, "fired")]  # fmt: skip


def test_a_paused_schedule_fires_nothing_and_resumes_from_now(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    scheduler, schedule, clock = setup(api, client, settings)
    scheduler.set_paused(schedule, True)
    clock.now = T0 + 5
    scheduler.tick()
    assert scheduler.store.firings(schedule.id) == []
    scheduler.set_paused(schedule, False)
    clock.now = T0 + 6
    scheduler.tick()
    assert [f.slot - T0 for f in scheduler.store.firings(schedule.id)] == [6.0]


def test_a_failed_script_execution_is_a_surprise_and_a_quiet_one_is_not(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    scheduler, schedule, clock = setup(api, client, settings, webhook={"url": "http://localhost/h",
                                                                       "secret": "s" * 20})  # fmt: skip
    http, as_ = api
    clock.now = T0 + 1
    scheduler.tick()
    finish(client, settings, scheduler.store.firings(schedule.id)[0].execution_id or "")  # a quiet firing
    clock.now = T0 + 2
    scheduler.tick()
    loud_id = scheduler.store.firings(schedule.id)[1].execution_id or ""
    store = ExecutionStore(client, settings)
    store.transition(loud_id, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)

    def check_failed(record: ExecutionRecord) -> ExecutionStatus:
        record.stderr = "Traceback ...\nCheckFailed: logs in a new format\n"
        record.error = ExecutionError(category=ErrorCategory.CHECK_FAILED, message="check failed: logs in a new format",
                                      retryable=False, details={"details": {"file": "b.log"}})  # fmt: skip
        return ExecutionStatus.FAILED

    store.transition(loud_id, {ExecutionStatus.RUNNING}, "test", check_failed)

    def events() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = http.get("/v1/events?type=script.failed", headers=as_["alpha"]).json()
        return found

    found: Any = wait_until(events, 10, "the surprise to be recorded")
    (event,) = found
    assert event["execution_id"] == loud_id and event["script"] == "tick@1.0.0" and event["schedule"] == schedule.id
    assert event["slot"] == T0 + 2 and event["error"]["details"] == {"details": {"file": "b.log"}}
    assert "CheckFailed" in event["stderr_tail"] and event["links"]["schedule"] == f"/v1/schedules/{schedule.id}"
    assert http.get(f"/v1/events?since={event['id']}", headers=as_["alpha"]).json() == []
    assert http.get("/v1/events", headers=as_["beta"]).json() == [], "another tenant sees none"
    outbox: Any = client.xrange(f"{settings.redis.key_prefix}:events")
    assert [f[b"id"].decode() for _, f in outbox if f[b"type"] == b"script.failed"] == [loud_id], "one webhook, not two"


def test_a_schedule_may_ask_for_its_quiet_firings_too(api: Api, client: redis.Redis, settings: Settings) -> None:
    scheduler, schedule, clock = setup(api, client, settings, notify="all",
                                       webhook={"url": "http://localhost/h", "secret": "s" * 20})  # fmt: skip
    http, as_ = api
    clock.now = T0 + 1
    scheduler.tick()
    finish(client, settings, scheduler.store.firings(schedule.id)[0].execution_id or "")

    def events() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = http.get("/v1/events?type=script.succeeded", headers=as_["alpha"]).json()
        return found

    found: Any = wait_until(events, 10, "the success event")
    assert found[0]["schedule"] == schedule.id and found[0]["error"] is None
