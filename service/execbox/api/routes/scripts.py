"""HTTP for the script library: register, search, list versions, promote, invoke. Only
translation: the work is execbox.library.service's."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request, Response

from execbox.api import answers
from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import LibraryDep, QuotasDep, SettingsDep, TenantDep, WaitersDep
from execbox.api.params import IdempotencyHeader, PreferHeader, TraceHeader, WaitQuery, wait_seconds
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.executions.schemas import ExecutionPublic
from execbox.library.schemas import (
    NAME_PATTERN,
    VERSION_PATTERN,
    Invoke,
    Promote,
    ScriptCreate,
    ScriptDetail,
    ScriptSummary,
    ScriptVersion,
)

router = APIRouter(prefix="/v1/scripts", tags=["scripts"], route_class=OffLoopRoute)
Name = Annotated[str, Path(pattern=NAME_PATTERN, description="Script name.")]
Version = Annotated[str, Path(pattern=VERSION_PATTERN, description="Semantic version.")]
_P = PROBLEM_DOC
_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "The body is not JSON.", **_P},
    404: {"description": "No such script or version.", **_P},
    409: {"description": "That version exists with other content.", **_P},
    413: {"description": "The body is too large.", **_P},
    422: {"description": "Invalid registration, inputs or evidence: every problem is listed.", **_P},
    503: {"description": "Redis unavailable; retry.", **_P},
    **UNAUTHORIZED_DOC,
}


@router.post("", status_code=201, response_model=ScriptVersion,
             responses={200: {"description": "The same registration again.", "model": ScriptVersion}, **_RESPONSES},
             summary="Register an immutable script version (the same registration again: 200)")  # fmt: skip
def register(
    body: ScriptCreate, response: Response, library: LibraryDep, quotas: QuotasDep, tenant: TenantDep
) -> ScriptVersion:
    stored, created = library.register(tenant, body, quotas.quota(tenant).policies)
    response.status_code = 201 if created else 200
    response.headers["Location"] = f"/v1/scripts/{body.name}"
    return stored


@router.get("", response_model=list[ScriptSummary], responses=_RESPONSES, summary="Find scripts by text or tag")
def search(
    library: LibraryDep,
    tenant: TenantDep,
    q: Annotated[str, Query(max_length=200, description="Words in the name, description or tags.")] = "",
    tag: Annotated[str, Query(max_length=64, description="A tag the newest version has.")] = "",
) -> list[ScriptSummary]:
    return library.search(tenant, q, tag)


@router.get("/{name}", response_model=ScriptDetail, responses=_RESPONSES, summary="A script's versions")
def detail(name: Name, library: LibraryDep, tenant: TenantDep) -> ScriptDetail:
    return library.detail(tenant, name)


@router.get("/{name}/versions/{version}", response_model=ScriptVersion, responses=_RESPONSES,
            summary="One version, with its code and schemas")  # fmt: skip
def version(name: Name, version: Version, library: LibraryDep, tenant: TenantDep) -> ScriptVersion:
    return library.resolve(tenant, name, version)


@router.post("/{name}/versions/{version}/promote", response_model=ScriptVersion, responses=_RESPONSES,
             summary="Move a version to proven (on evidence) or deprecated")  # fmt: skip
def promote(name: Name, version: Version, body: Promote, library: LibraryDep, tenant: TenantDep) -> ScriptVersion:
    return library.promote(tenant, name, version, body)


@router.post("/{name}/invoke", status_code=202, response_model=ExecutionPublic, responses=_RESPONSES,
             summary="Run a version (or the newest proven one) as an execution")  # fmt: skip
async def invoke(
    name: Name,
    body: Invoke,
    request: Request,
    response: Response,
    settings: SettingsDep,
    waiters: WaitersDep,
    library: LibraryDep,
    tenant: TenantDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    traceparent: TraceHeader = None,
    idempotency_key: IdempotencyHeader = None,
) -> ExecutionPublic:
    wait_s = wait_seconds(settings, wait, prefer)
    submitted = await to_thread.run_sync(lambda: library.invoke(
        tenant, name, body.version, body.inputs, body.files, body.labels, traceparent, idempotency_key))  # fmt: skip
    return await answers.submitted(request, response, waiters, submitted, wait_s)
