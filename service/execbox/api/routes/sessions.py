"""HTTP for sessions: open, list, read, delete. Only translation: the work is
execbox.sessions.service's; executions run in a session through POST /v1/executions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import SessionsDep, TenantDep
from execbox.api.params import TraceHeader
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.sessions.schemas import SessionCreate, SessionList, SessionPublic
from execbox.sessions.status import SessionStatus

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], route_class=OffLoopRoute)
SessionId = Annotated[str, Path(pattern=r"^ses_[a-z2-7]{26}$", description="Session id (`ses_...`).")]
_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "The body is not JSON.", **PROBLEM_DOC},
    403: {"description": "The tenant may not use that policy.", **PROBLEM_DOC},
    404: {"description": "No such session (or another tenant's).", **PROBLEM_DOC},
    413: {"description": "The body is too large.", **PROBLEM_DOC},
    422: {"description": "Invalid request: the fields at fault are listed.", **PROBLEM_DOC},
    429: {"description": "The tenant has as many sessions open as it may.", **PROBLEM_DOC},
    503: {"description": "Redis unavailable; retry.", **PROBLEM_DOC},
    **UNAUTHORIZED_DOC,
}


@router.post("", status_code=201, response_model=SessionPublic, responses=_RESPONSES, summary="Open a session")
def open_session(
    body: SessionCreate, response: Response, sessions: SessionsDep, tenant: TenantDep, traceparent: TraceHeader = None
) -> SessionPublic:
    record = sessions.open(tenant, body, traceparent)
    response.headers["Location"] = f"/v1/sessions/{record.id}"
    return record.public()


@router.get("", response_model=SessionList, responses=_RESPONSES, summary="The tenant's sessions, newest first")
def list_sessions(
    sessions: SessionsDep,
    tenant: TenantDep,
    status: Annotated[SessionStatus | None, Query(description="Only sessions in this status.")] = None,
) -> SessionList:
    return SessionList(sessions=[r.public() for r in sessions.list(tenant, status)])


@router.get("/{session_id}", response_model=SessionPublic, responses=_RESPONSES, summary="Get a session")
def get_session(session_id: SessionId, sessions: SessionsDep, tenant: TenantDep) -> SessionPublic:
    return sessions.owned(tenant, session_id).public()


@router.delete("/{session_id}", response_model=SessionPublic, responses=_RESPONSES, summary="End a session now")
def delete_session(session_id: SessionId, sessions: SessionsDep, tenant: TenantDep) -> SessionPublic:
    return sessions.delete(tenant, session_id).public()
