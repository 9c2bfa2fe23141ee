"""HTTP for executions: POST /v1/executions, GET /v1/executions/{id}[/record], POST .../cancel, .../reconcile,
GET .../artifacts/{name}. Only translation: the work is execbox.executions.submit's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import quote

from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from execbox.api import answers
from execbox.api.bodies import PARSES, OffLoopRoute, parse_json
from execbox.api.deps import (
    ArtifactsDep,
    PoliciesDep,
    SettingsDep,
    StoreDep,
    SubmissionsDep,
    TenantDep,
    WaitersDep,
)
from execbox.api.params import IdempotencyHeader, PreferHeader, TraceHeader, WaitQuery, disconnected, wait_seconds
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.tracing import from_traceparent
from execbox.executions import live
from execbox.executions.effects import ExecutionReconcile
from execbox.executions.record import RunRecord
from execbox.executions.schemas import EXECUTION_ID_PATTERN, ExecutionCreate, ExecutionPublic
from execbox.executions.submit import mine
from execbox.files.blobs import ArtifactStore
from execbox.files.collect import RICH_DIR
from execbox.files.errors import ArtifactNotFound
from execbox.files.media import DOWNLOAD_HEADERS, served_as
from execbox.files.schemas import check_input_path

router = APIRouter(prefix="/v1/executions", tags=["executions"], route_class=OffLoopRoute)
_ACCEPTS = CapacityLimiter(4)
"""Admissions (a few Redis round trips each) run in at most this many threads: a burst of them
then queues here instead of starving the event loop of the interpreter lock (on 2 cores, 40 busy
threads made /healthz wait seconds; 8 gave a /healthz max of 60-210 ms under 300 arrivals at once, 4 gave 38-64 ms)."""

ExecutionId = Annotated[str, Path(pattern=EXECUTION_ID_PATTERN, description="Execution id (`exe_...`).")]
_PROBLEM = PROBLEM_DOC
_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "Finished within the wait.", "model": ExecutionPublic},
    202: {"description": "Accepted (or not finished within the wait).", "model": ExecutionPublic},
    400: {"description": "The body is not JSON.", **_PROBLEM},
    404: {"description": "No such execution (or past retention).", **_PROBLEM},
    409: {"description": "The execution already ended.", **_PROBLEM},
    413: {"description": "The body is too large.", **_PROBLEM},
    422: {"description": "A field is invalid or above a policy ceiling.", **_PROBLEM},
    403: {"description": "The tenant may not use the named policy.", **_PROBLEM},
    429: {"description": "A tenant quota was passed; see Retry-After and RateLimit-*.", **_PROBLEM},
    503: {"description": "The queue is full or Redis unavailable; retry after Retry-After.", **_PROBLEM},
    **UNAUTHORIZED_DOC,
}


_CREATE_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ExecutionCreate"}},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["request"],
                "properties": {
                    "request": {"type": "string", "description": "The ExecutionCreate object, as JSON text."},
                    "files": {
                        "type": "array",
                        "items": {"type": "string", "format": "binary"},
                        "description": "Input files; each part's filename is its path under the working directory.",
                    },
                },
            }
        },
    },
}


async def _read_body(request: Request, max_files: int) -> tuple[ExecutionCreate, list[tuple[str, bytes]]]:
    """The request as JSON, or as multipart (a `request` JSON part plus `files` parts)."""
    extra: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form(max_files=max_files + 1, max_fields=16)
        text = form.get("request")
        raw: str | None = (await text.read()).decode() if isinstance(text, UploadFile) else text
        if raw is None:
            raise InvalidRequest(
                "multipart requests need a `request` part with the JSON body", (FieldProblem("request", "missing"),)
            )
        for part in form.getlist("files"):
            if not isinstance(part, UploadFile) or not part.filename:
                raise InvalidRequest(
                    "each `files` part needs a filename: its path under the working directory",
                    (FieldProblem("files", "part without a filename"),),
                )
            try:
                check_input_path(part.filename)
            except ValueError as exc:
                raise InvalidRequest(str(exc), (FieldProblem(f"files[{part.filename}]", str(exc)),)) from exc
            extra.append((part.filename, await part.read()))
    else:
        raw = (await request.body()).decode("utf-8", "replace")

    def parse() -> ExecutionCreate:
        try:
            return ExecutionCreate.model_validate(parse_json(raw))
        except ValidationError as exc:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
            ) from exc

    return await to_thread.run_sync(parse, limiter=PARSES), extra  # off the event loop, as OffLoopRoute does


@router.post(
    "",
    status_code=202,
    response_model=ExecutionPublic,
    responses=_RESPONSES,
    summary="Run code in a fresh sandbox",
    openapi_extra={"requestBody": _CREATE_BODY},
)
async def create_execution(
    request: Request,
    response: Response,
    settings: SettingsDep,
    waiters: WaitersDep,
    policies: PoliciesDep,
    submissions: SubmissionsDep,
    tenant: TenantDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    traceparent: TraceHeader = None,
    idempotency_key: IdempotencyHeader = None,
) -> ExecutionPublic:
    wait_s = wait_seconds(settings, wait, prefer)
    body, extra = await _read_body(request, policies.max_ceiling("input_files"))
    gated = bool(getattr(request.state, "api_key_gated", False))  # its writes wait for approval, asked or not
    submitted = await to_thread.run_sync(
        lambda: submissions.submit(tenant, body, extra, traceparent, idempotency_key, approval_required=gated),
        limiter=_ACCEPTS,
    )
    return await answers.submitted(request, response, waiters, submitted, wait_s)


@router.get("/{execution_id}", response_model=ExecutionPublic, responses=_RESPONSES, summary="Get an execution")
async def get_execution(
    execution_id: ExecutionId,
    request: Request,
    response: Response,
    settings: SettingsDep,
    waiters: WaitersDep,
    tenant: TenantDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    traceparent: TraceHeader = None,
) -> ExecutionPublic:
    wait_s = wait_seconds(settings, wait, prefer)
    record = mine(await waiters.record(execution_id), tenant, execution_id)
    if wait_s > 0:
        record = await waiters.wait(execution_id, wait_s, disconnected(request)) or record
    return answers.execution(response, record, from_traceparent(traceparent), status=200)


@router.get(
    "/{execution_id}/record",
    response_model=RunRecord,
    summary="The run record: request hash, policy, image, worker, transitions, resources, outcome",
    responses={
        404: {"description": "No such execution.", **_PROBLEM},
        422: {"description": "Bad id.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
)
def get_run_record(
    execution_id: ExecutionId, response: Response, submissions: SubmissionsDep, tenant: TenantDep
) -> RunRecord:
    record = submissions.owned(tenant, execution_id)
    response.headers["X-Trace-Id"] = record.trace_id
    return RunRecord.of(record)


@router.post(
    "/{execution_id}/cancel",
    status_code=202,
    response_model=ExecutionPublic,
    responses=_RESPONSES,
    summary="Cancel a queued or running execution",
)
def cancel_execution(
    execution_id: ExecutionId,
    response: Response,
    submissions: SubmissionsDep,
    tenant: TenantDep,
    traceparent: TraceHeader = None,
) -> ExecutionPublic:
    record = submissions.cancel(tenant, execution_id)
    return answers.execution(response, record, from_traceparent(traceparent))


@router.post(
    "/{execution_id}/reconcile",
    response_model=ExecutionPublic,
    responses=_RESPONSES,
    summary="Settle an unknown outcome: applied (succeeded) or not applied (failed; submit again with its key)",
)
def reconcile_execution(
    execution_id: ExecutionId,
    body: ExecutionReconcile,
    response: Response,
    submissions: SubmissionsDep,
    tenant: TenantDep,
    traceparent: TraceHeader = None,
) -> ExecutionPublic:
    applied = body.outcome == "applied"
    record = submissions.reconcile(tenant, execution_id, applied, body.outputs, body.reason)
    return answers.execution(response, record, from_traceparent(traceparent), status=200)


@router.get(
    "/{execution_id}/artifacts/{name:path}",
    summary="Download an artifact",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"*/*": {}},
            "description": "The artifact's bytes, with the media type it was stored with "
            "(application/octet-stream when none).",
        },
        404: {"description": "No such execution or artifact.", **_PROBLEM},
        422: {"description": "Malformed execution id.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
)
def download_artifact(
    execution_id: ExecutionId, name: str, artifacts: ArtifactsDep, submissions: SubmissionsDep, tenant: TenantDep
) -> StreamingResponse:
    record = submissions.owned(tenant, execution_id)
    artifact = next((a for a in record.artifacts if a.name == name), None)
    if artifact is None:
        raise ArtifactNotFound(execution_id, name)
    return _stream(artifacts, execution_id, name, artifact.media_type, artifact.sha256)


@router.get(
    "/{execution_id}/events",
    summary="Live events of an execution (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "status, stdout, stderr, truncated, result, "
            "gap and exactly one end (the finished execution), each with a resumable `id:`.",
        },  # fmt: skip
        404: {"description": "No such execution.", **_PROBLEM},
        422: {"description": "Malformed execution id or Last-Event-ID.", **_PROBLEM},
        503: {"description": "Redis unavailable; retry.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
)
async def execution_events(
    execution_id: ExecutionId,
    submissions: SubmissionsDep,
    waiters: WaitersDep,
    store: StoreDep,
    settings: SettingsDep,
    tenant: TenantDep,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", pattern=r"^\d{1,20}-\d{1,20}$", description="Resume after this id.")
    ] = None,
) -> StreamingResponse:
    if last_event_id is not None:
        try:
            live.check_id(last_event_id)
        except ValueError as exc:  # checked before the 200: Redis would refuse it mid-stream
            raise InvalidRequest(str(exc), (FieldProblem("header.Last-Event-ID", str(exc)),)) from exc
    await to_thread.run_sync(submissions.owned, tenant, execution_id)  # 404 before the stream starts
    keepalive_ms = int(settings.api.sse_keepalive_s * 1000)

    async def events() -> AsyncIterator[str]:
        reader = live.read(waiters.streams, store.keys, execution_id, last_event_id or "0",
                           keepalive_ms)  # fmt: skip
        async for item in reader:
            if item is None:
                yield ": keepalive\n\n"
                continue
            event_id, event, data = item
            if event == live.END:  # the finished execution, as GET answers it
                record = await to_thread.run_sync(submissions.owned, tenant, execution_id)
                data = record.public().model_dump_json()
            yield (f"id: {event_id}\n" if event_id else "") + f"event: {event}\ndata: {data}\n\n"

    # A client that goes away only ends this generator; the run is not touched.
    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


@router.get(
    "/{execution_id}/results/{file}",
    summary="Download a rich result's representation",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"image/png": {}, "text/html": {}}, "description": "The representation's bytes."},
        404: {"description": "No such execution or result.", **_PROBLEM},
        422: {"description": "Malformed execution id.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
)
def download_result(
    execution_id: ExecutionId, file: str, artifacts: ArtifactsDep, submissions: SubmissionsDep, tenant: TenantDep
) -> StreamingResponse:
    record = submissions.owned(tenant, execution_id)
    suffix = f"/results/{quote(file)}"
    data = next((d for r in record.results for d in r.data.values() if d.url.endswith(suffix)), None)
    if data is None:
        raise ArtifactNotFound(execution_id, f"results/{file}")
    return _stream(artifacts, execution_id, f"{RICH_DIR}{file}", data.media_type, data.sha256)


def _stream(artifacts: ArtifactStore, execution_id: str, name: str, media_type: str, sha256: str) -> StreamingResponse:
    try:
        size = artifacts.size(execution_id, name)
    except FileNotFoundError as exc:
        raise ArtifactNotFound(execution_id, name) from exc
    return StreamingResponse(
        artifacts.read(execution_id, name),
        media_type=served_as(media_type),
        headers={
            **DOWNLOAD_HEADERS,
            "Content-Length": str(size),
            "ETag": f'"{sha256}"',
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name.rsplit('/', 1)[-1])}",
        },
    )
