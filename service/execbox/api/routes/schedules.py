"""HTTP for schedules: create, list, read, pause, resume, delete, and the firing list. Only
translation: the work is execbox.schedules.scheduler's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import LibraryDep, QuotasDep, SchedulerDep, SettingsDep, SurprisesDep, TenantDep
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.schedules.errors import ScheduleNotFound
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.schemas import SCHEDULE_ID_PATTERN, Firing, Schedule, ScheduleCreate, ScheduleUpdate
from execbox.schedules.surprises import Surprise

router = APIRouter(prefix="/v1/schedules", tags=["schedules"], route_class=OffLoopRoute)
ScheduleId = Annotated[str, Path(pattern=SCHEDULE_ID_PATTERN, description="Schedule id (`sch_...`).")]
_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "The body is not JSON.", **PROBLEM_DOC},
    404: {"description": "No such schedule, or no such script.", **PROBLEM_DOC},
    413: {"description": "The body is too large.", **PROBLEM_DOC},
    422: {"description": "Invalid cron, time zone, script or inputs.", **PROBLEM_DOC},
    503: {"description": "Redis unavailable; retry.", **PROBLEM_DOC},
    **UNAUTHORIZED_DOC,
}


def _owned(scheduler: Scheduler, tenant: str, schedule_id: str) -> Schedule:
    schedule = scheduler.store.get(schedule_id)
    if schedule is None or schedule.tenant != tenant:
        raise ScheduleNotFound(schedule_id)
    return schedule


@router.post("", status_code=201, response_model=Schedule, responses=_RESPONSES, summary="Fire a script on a calendar")
def create(
    body: ScheduleCreate,
    response: Response,
    scheduler: SchedulerDep,
    quotas: QuotasDep,
    settings: SettingsDep,
    tenant: TenantDep,
) -> Schedule:
    schedule = scheduler.admit(tenant, body, quotas.quota(tenant), settings.webhooks.allow_hosts)
    response.headers["Location"] = f"/v1/schedules/{schedule.id}"
    return schedule


@router.get("", response_model=list[Schedule], responses=_RESPONSES, summary="The tenant's schedules")
def list_schedules(scheduler: SchedulerDep, tenant: TenantDep) -> list[Schedule]:
    return scheduler.store.of_tenant(tenant)


@router.get("/{schedule_id}", response_model=Schedule, responses=_RESPONSES, summary="Get a schedule")
def get(schedule_id: ScheduleId, scheduler: SchedulerDep, tenant: TenantDep) -> Schedule:
    return _owned(scheduler, tenant, schedule_id)


@router.patch("/{schedule_id}", response_model=Schedule, responses=_RESPONSES,
              summary="Change the inputs or files of the next firings")  # fmt: skip
def update(
    schedule_id: ScheduleId, body: ScheduleUpdate, scheduler: SchedulerDep, library: LibraryDep, tenant: TenantDep
) -> Schedule:
    schedule = _owned(scheduler, tenant, schedule_id)
    if body.inputs is not None:
        library.checked(tenant, schedule.script, body.inputs)
        schedule.inputs = body.inputs
    if body.files is not None:
        schedule.files = body.files
    return scheduler.save(schedule)


@router.post("/{schedule_id}/pause", response_model=Schedule, responses=_RESPONSES, summary="Pause a schedule")
def pause(schedule_id: ScheduleId, scheduler: SchedulerDep, tenant: TenantDep) -> Schedule:
    return scheduler.set_paused(_owned(scheduler, tenant, schedule_id), True)


@router.post("/{schedule_id}/resume", response_model=Schedule, responses=_RESPONSES,
             summary="Resume a schedule (slots passed while paused are not fired)")  # fmt: skip
def resume(schedule_id: ScheduleId, scheduler: SchedulerDep, tenant: TenantDep) -> Schedule:
    return scheduler.set_paused(_owned(scheduler, tenant, schedule_id), False)


@router.delete("/{schedule_id}", status_code=204, responses=_RESPONSES, summary="Delete a schedule")
def delete(schedule_id: ScheduleId, scheduler: SchedulerDep, tenant: TenantDep) -> Response:
    scheduler.store.delete(_owned(scheduler, tenant, schedule_id))
    return Response(status_code=204)


@router.get("/{schedule_id}/firings", response_model=list[Firing], responses=_RESPONSES,
            summary="Every slot handled: fired (with its execution), queued or skipped, and why")  # fmt: skip
def firings(schedule_id: ScheduleId, scheduler: SchedulerDep, tenant: TenantDep) -> list[Firing]:
    return scheduler.store.firings(_owned(scheduler, tenant, schedule_id).id)


events_router = APIRouter(prefix="/v1/events", tags=["schedules"], route_class=OffLoopRoute)


@events_router.get("", response_model=list[Surprise], responses=_RESPONSES,
                   summary="Surprises: failed script executions (invoked or scheduled), oldest first")  # fmt: skip
def events(
    surprises: SurprisesDep,
    tenant: TenantDep,
    type: Annotated[str | None, Query(max_length=64, description="Only events of this type (script.failed).")] = None,
    since: Annotated[
        str, Query(max_length=64, pattern=r"^(-|\d{1,19}-\d{1,19})$", description="After this event id.")
    ] = "-",
) -> list[Surprise]:
    return surprises.list(tenant, type, since)
