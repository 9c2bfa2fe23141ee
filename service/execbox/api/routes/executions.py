"""POST /v1/executions, GET /v1/executions/{id}, POST /v1/executions/{id}/cancel."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response

from execbox.api.deps import Services, ServicesDep
from execbox.errors import ConflictError, ExecutionNotFound, FieldProblem, InvalidRequest
from execbox.models import (
    EXECUTION_ID_PATTERN,
    ErrorCategory,
    ExecutionCreate,
    ExecutionError,
    ExecutionPublic,
    ExecutionRecord,
    ExecutionStatus,
    Problem,
    Transition,
)
from execbox.queue import cancel_queued, enqueue
from execbox.tracing import TraceContext, from_traceparent

router = APIRouter(prefix="/v1/executions", tags=["executions"])
BY = "api"
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)

ExecutionId = Annotated[str, Path(pattern=EXECUTION_ID_PATTERN, description="Execution id (`exe_...`).")]
WaitQuery = Annotated[
    float | None,
    Query(
        ge=0,
        description="Seconds to wait for the execution to finish "
        "before answering (bounded by the server's max_wait_s).",
    ),
]
PreferHeader = Annotated[str | None, Header(description="RFC 7240 `wait=SECONDS`, like ?wait=.")]
TraceHeader = Annotated[str | None, Header(description="W3C trace context; a new trace starts without it.")]
_PROBLEM: dict[str, object] = {
    "model": Problem,
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}
_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "Finished within the wait.", "model": ExecutionPublic},
    202: {"description": "Accepted (or not finished within the wait).", "model": ExecutionPublic},
    400: {"description": "The body is not JSON.", **_PROBLEM},
    404: {"description": "No such execution (or past retention).", **_PROBLEM},
    409: {"description": "The execution already ended.", **_PROBLEM},
    413: {"description": "The body is too large.", **_PROBLEM},
    422: {"description": "A field is invalid or above a policy ceiling.", **_PROBLEM},
    503: {"description": "Redis unavailable; retry after Retry-After.", **_PROBLEM},
}


def new_execution_id() -> str:
    return "exe_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def _wait_seconds(services: Services, query: float | None, prefer: str | None) -> float:
    field, value = "query.wait", query
    if value is None and prefer:
        match = _PREFER_WAIT.search(prefer)
        field, value = "header.Prefer", float(match.group(1)) if match else None
    if value is None:
        return 0.0
    limit = services.settings.api.max_wait_s
    if value > limit:
        raise InvalidRequest(
            f"{field}: {value:g} s is above the server's limit of {limit:g} s",
            (FieldProblem(field, f"at most {limit:g}; poll GET /v1/executions/{{id}} after that"),),
        )
    return value


def _answer(
    response: Response, record: ExecutionRecord, trace: TraceContext, status: int | None = None
) -> ExecutionPublic:
    response.status_code = status or (200 if record.status.terminal else 202)
    response.headers["Location"] = f"/v1/executions/{record.id}"
    response.headers["X-Trace-Id"] = record.trace_id
    response.headers["traceparent"] = TraceContext(record.trace_id, trace.span_id, trace.flags).traceparent
    return record.public()


@router.post(
    "", status_code=202, response_model=ExecutionPublic, responses=_RESPONSES, summary="Run code in a fresh sandbox"
)
def create_execution(
    body: ExecutionCreate,
    response: Response,
    services: ServicesDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    traceparent: TraceHeader = None,
) -> ExecutionPublic:
    wait_s = _wait_seconds(services, wait, prefer)
    language = services.languages.get(body.language)
    policy = services.policies.resolve(body.policy, len(body.code.encode()))
    trace = from_traceparent(traceparent)
    now = time.time()
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    record = ExecutionRecord(
        id=new_execution_id(),
        status=ExecutionStatus.QUEUED,
        language=language.name,
        trace_id=trace.trace_id,
        labels=body.labels,
        created_at=now,
        policy=policy,
        code=body.code,
        env=body.env,
        request_sha256=hashlib.sha256(canonical.encode()).hexdigest(),
        queue_deadline=now + policy.queue_timeout_s,
        transitions=[Transition(status=ExecutionStatus.QUEUED, at=now, by=BY)],
    )
    services.store.create(record)
    enqueue(services.queue, record, trace.child().traceparent, services.settings)
    if wait_s > 0:
        record = services.store.wait_terminal(record.id, wait_s, BY) or record
    return _answer(response, record, trace)


@router.get("/{execution_id}", response_model=ExecutionPublic, responses=_RESPONSES, summary="Get an execution")
def get_execution(
    execution_id: ExecutionId,
    response: Response,
    services: ServicesDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    traceparent: TraceHeader = None,
) -> ExecutionPublic:
    wait_s = _wait_seconds(services, wait, prefer)
    if wait_s > 0:
        record = services.store.wait_terminal(execution_id, wait_s, BY)
    else:
        record = services.store.refresh(execution_id, BY)
    if record is None:
        raise ExecutionNotFound(execution_id)
    return _answer(response, record, from_traceparent(traceparent), status=200)


@router.post(
    "/{execution_id}/cancel",
    status_code=202,
    response_model=ExecutionPublic,
    responses=_RESPONSES,
    summary="Cancel a queued or running execution",
)
def cancel_execution(
    execution_id: ExecutionId, response: Response, services: ServicesDep, traceparent: TraceHeader = None
) -> ExecutionPublic:
    store = services.store

    def cancel_queued_record(record: ExecutionRecord) -> ExecutionStatus:
        record.cancel_requested = True
        record.error = ExecutionError(
            category=ErrorCategory.CANCELLED, message="cancelled by the client before it started", retryable=False
        )
        return ExecutionStatus.CANCELLED

    record = store.refresh(execution_id, BY)
    if record is None:
        raise ExecutionNotFound(execution_id)
    if record.status is ExecutionStatus.QUEUED:
        done = store.transition(execution_id, {ExecutionStatus.QUEUED}, BY, cancel_queued_record)
        if done is not None:
            cancel_queued(services.queue, execution_id)
            return _answer(response, done, from_traceparent(traceparent))
        record = store.get(execution_id) or record
    if record.status is ExecutionStatus.RUNNING:
        # The worker running it is told to kill the sandbox; it then records `cancelled`.
        store.signal(execution_id, "cancel")
        return _answer(response, record, from_traceparent(traceparent))
    raise ConflictError(f"execution {execution_id} already ended as {record.status.value}; nothing to cancel")
