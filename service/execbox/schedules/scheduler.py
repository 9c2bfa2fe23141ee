"""Firing schedules: every slot once, whatever runs how many schedulers and restarts them.

`tick(now)` looks at the schedules that are due (`schedules:due`), computes the slots since the
last one handled, and handles each: a slot is claimed in Redis first (SET NX per schedule and
slot), so one scheduler alone fires it, records it in the firing list and starts its execution
through the script library (under the Idempotency-Key `<schedule>:<slot>`). Slots more than
`misfire_grace_s` late (a downtime) are skipped, or the latest of them fired once; a slot whose
previous firing still runs is skipped, or kept as the one queued slot. The scheduler runs as a
thread in every API process (and as `execbox scheduler` on its own). Each due schedule is handled
under the loop's guard (execbox.core.poison): one whose handling raises is looked at again after a
backoff and set aside after its last attempt, and the tick goes on with the next, so other
tenants' schedules keep their timing.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from pydantic import ValidationError

from execbox.catalog.webhook_hosts import host_allowed
from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.core.metrics import LoopMetrics
from execbox.core.poison import Guard
from execbox.executions.schemas import Origin
from execbox.executions.store import ExecutionStore
from execbox.library.service import Library
from execbox.schedules import calendar
from execbox.schedules.metrics import ScheduleMetrics
from execbox.schedules.schemas import Firing, Schedule, ScheduleCreate
from execbox.schedules.schemas import FiringStatus as Status
from execbox.schedules.store import ScheduleStore

log = logging.getLogger(__name__)
TICK_S = 0.5


class ScheduleQuota(Protocol):
    """What the scheduler reads of a tenant's quota (execbox.tenancy.quotas)."""

    @property
    def schedules(self) -> int: ...

    @property
    def schedule_min_interval_s(self) -> float: ...


@dataclass
class Scheduler:
    store: ScheduleStore
    library: Library
    executions: ExecutionStore
    metrics: ScheduleMetrics | None = None
    clock: Callable[[], float] = time.time
    loop_metrics: LoopMetrics | None = None

    def __post_init__(self) -> None:
        self.guard = Guard(self.store.redis, self.store.keys, "scheduler", (self.store.keys.schedules_due,),
                           self.loop_metrics, clock=self.clock)  # fmt: skip
        """A schedule whose handling raises is looked at again after a backoff, and set aside
        (taken off `schedules:due`, a dead letter) after its last attempt: never first in line for ever."""

    def admit(self, tenant: str, body: ScheduleCreate, quota: ScheduleQuota, allow_hosts: list[str]) -> Schedule:
        """A client's new schedule, created once it passes every check (each refusal a 422 naming
        its field, nothing stored): the calendar at most as often as the tenant's quota allows, the
        tenant under its count of schedules, a webhook host the deployment allows, a script the
        tenant may run with inputs its schema accepts (404 for an unknown script)."""
        try:
            calendar.check(body.cron, body.timezone, quota.schedule_min_interval_s)
        except calendar.CalendarError as exc:
            field = "timezone" if "zone" in str(exc) else "cron"
            raise InvalidRequest(str(exc), (FieldProblem(field, str(exc)),)) from exc
        if self.store.count(tenant) >= quota.schedules:
            problem = FieldProblem("body", f"this tenant holds {quota.schedules} schedules, its policy's limit; "
                                   "delete one first")  # fmt: skip
            raise InvalidRequest(problem.message, (problem,))
        if body.webhook is not None and not host_allowed(body.webhook.url, allow_hosts):
            problem = FieldProblem("webhook.url", "host not allowed for callbacks (EXECBOX_WEBHOOKS__ALLOW_HOSTS)")
            raise InvalidRequest(problem.message, (problem,))
        self.library.checked(tenant, body.script, body.inputs)
        return self.create(tenant, body)

    def create(self, tenant: str, body: ScheduleCreate) -> Schedule:
        """A schedule as given, unchecked (`admit` is a client's way in)."""
        now = self.clock()
        schedule = Schedule(**body.model_dump(), id="sch_" + secrets.token_hex(13)[:26], tenant=tenant,
                            created_at=now, last_slot=now, queue=self.queue)  # fmt: skip
        self.store.put(schedule, self._next(schedule))
        return schedule

    @property
    def queue(self) -> str:
        return self.library.submissions.settings.queue.name

    def save(self, schedule: Schedule) -> Schedule:
        self.store.put(schedule, None if schedule.paused else self._next(schedule))
        return schedule

    def set_paused(self, schedule: Schedule, paused: bool) -> Schedule:
        """Pause, or resume: slots that passed while paused are not fired afterwards."""
        schedule.paused = paused
        if not paused:
            schedule.last_slot = max(schedule.last_slot, self.clock())
        self.store.put(schedule, None if paused else self._next(schedule))
        return schedule

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except ServiceError as exc:
                log.warning("scheduler: %s", exc.message)
            except Exception as exc:  # each schedule is guarded; this is what is left (the due list itself)
                self.guard.note(exc, "a tick")
            stop.wait(TICK_S)

    def tick(self) -> None:
        """Handle every schedule that is due, each under the guard: one that fails does not stop the tick."""
        now = self.clock()
        self.guard.replay()
        due = self.store.keys.schedules_due
        for schedule_id in self.store.due(now):
            self.guard.record(due, schedule_id, partial(self._look, schedule_id, now))

    def _look(self, schedule_id: str, now: float) -> None:
        schedule = self.store.get(schedule_id)
        if schedule is None or schedule.paused or schedule.queue != self.queue:
            return  # another deployment's schedule (on the same Redis) is its schedulers' to fire
        self._handle(schedule, now)

    def _handle(self, schedule: Schedule, now: float) -> None:
        if schedule.queued_slot is not None and not self._busy(schedule):
            queued, schedule.queued_slot = schedule.queued_slot, None
            self._fire(schedule, queued, now, claim_suffix=":queued")
        slots = calendar.due(schedule.cron, schedule.timezone, schedule.last_slot, now)
        late = [s for s in slots if now - s > schedule.misfire_grace_s]
        for slot in slots:
            if not self.store.claim(schedule.id, slot):
                continue  # another scheduler has it
            if slot in late and not (schedule.misfire == "fire_latest" and slot == slots[-1]):
                grace = schedule.misfire_grace_s
                self._record(schedule, slot, now, "skipped_misfire", f"{now - slot:.0f} s late (grace {grace:g} s)")
            elif self._busy(schedule):
                if schedule.overlap == "queue_one" and schedule.queued_slot is None:
                    schedule.queued_slot = slot
                    self._record(schedule, slot, now, "queued", "the previous firing still runs")
                else:
                    self._record(schedule, slot, now, "skipped_overlap", f"{schedule.last_execution} still runs")
            else:
                self._fire(schedule, slot, now)
        if slots:
            schedule.last_slot = max(schedule.last_slot, slots[-1])
        self.store.put(schedule, self._next(schedule))

    def _fire(self, schedule: Schedule, slot: float, now: float, claim_suffix: str = "") -> None:
        if claim_suffix and not self.store.claim(schedule.id, slot, claim_suffix):
            return
        name, _, version = schedule.script.partition("@")
        origin = Origin(schedule=schedule.id, slot=slot)
        try:
            submitted = self.library.invoke(schedule.tenant, name, version, schedule.inputs, schedule.files,
                                            schedule.labels, idempotency_key=f"{schedule.id}:{slot:.3f}",
                                            origin=origin)  # fmt: skip
        except ServiceError as exc:
            self._record(schedule, slot, now, "not_started", exc.message)
            return
        except ValidationError as exc:  # the execution's own validation refused what the schedule stored
            self._record(schedule, slot, now, "not_started", _refusal(exc))
            return
        schedule.last_execution = submitted.record.id
        lag = max(submitted.record.created_at - slot, 0.0)
        self._record(schedule, slot, now, "fired", "", submitted.record.id, lag)
        if self.metrics is not None:
            self.metrics.lag.observe(lag)

    def _busy(self, schedule: Schedule) -> bool:
        """The latest firing's execution has not ended."""
        if schedule.last_execution is None:
            return False
        record = self.executions.get(schedule.last_execution)
        return record is not None and not record.status.terminal

    def _record(
        self, schedule: Schedule, slot: float, now: float, status: Status, detail: str,
        execution_id: str | None = None, lag: float | None = None,
    ) -> None:  # fmt: skip
        firing = Firing(slot=slot, at=now, status=status, detail=detail, execution_id=execution_id, lag_s=lag)
        self.store.add_firing(schedule.id, firing)
        if self.metrics is not None:
            self.metrics.firings.labels(status).inc()

    def _next(self, schedule: Schedule) -> float:
        """When to look again: the next slot, or at every tick while a slot waits behind a running firing."""
        if schedule.queued_slot is not None:
            return self.clock()
        return next(calendar.slots(schedule.cron, schedule.timezone, max(schedule.last_slot, self.clock())))


def _refusal(exc: ValidationError) -> str:
    """A validation error in a line the schedule's owner can act on (field and problem, no input echoed)."""
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(request)'}: {e['msg']}" for e in exc.errors())
    return f"the execution was refused: {problems}; change the schedule (PATCH /v1/schedules/{{id}})"[:1000]
