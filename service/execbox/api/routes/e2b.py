"""HTTP for the E2B-compatible API (docs/e2b.md): E2B's control plane under /e2b, and what E2B
calls a sandbox's envd and code interpreter under /e2b/sandbox (the address to give
E2B_SANDBOX_URL: the SDK sends every sandbox's calls there, naming the sandbox in a header). Only
translation: the work is execbox.e2b's. Errors take E2B's shapes, not problem+json: the control
plane's `{"code": <status>, "message"}`, Connect's `{"code": "<name>", "message"}` for RPCs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile

from execbox.api.bodies import PARSES, OffLoopRoute
from execbox.api.deps import EnvdDep, InterpreterDep, KeyCheck, KeyCheckDep, SandboxesDep, WatchersDep
from execbox.api.params import TraceHeader
from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.e2b import commands, filesystem, watchers
from execbox.e2b import connect as connectrpc
from execbox.e2b.errors import NotOffered, SandboxGone
from execbox.e2b.sandboxes import Opened, Sandboxes, metadata_filter
from execbox.e2b.schemas import (
    ConnectSandbox,
    Context,
    Execute,
    NewContext,
    NewSandbox,
    Sandbox,
    SandboxDetail,
    SetTimeout,
)
from execbox.tenancy.apikeys import DEFAULT_TENANT
from execbox.tenancy.errors import UngatedRoute


def error_response(method: str, path: str, status: int, message: str, headers: Mapping[str, str]) -> Response:
    """An error in E2B's shape: its SDK parses the body before it looks at the status. The app's
    error handlers answer every error under /e2b/ with it (problems.install's `foreign`): the
    service's own, validation (422 becomes E2B's 400), a wrong method, an oversized body."""
    headers = dict(headers)
    status = 400 if status == 422 else status
    if method == "POST" and path.endswith("/v2/sandboxes") and status >= 500:
        headers["Should-Retry"] = "false"  # a retried create could leave a second sandbox
    rpc = "/process.Process/" in path or "/filesystem.Filesystem/" in path
    code: int | str = connectrpc.connect_code(status) if rpc else status
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


control = APIRouter(prefix="/e2b", tags=["e2b"], route_class=OffLoopRoute, include_in_schema=False)
sandbox = APIRouter(prefix="/e2b/sandbox", tags=["e2b"], route_class=OffLoopRoute, include_in_schema=False)


async def _tenant(request: Request, check: KeyCheck) -> str:
    """The tenant of the X-API-KEY header (E2B's name for the API key; 401 without a valid one)."""
    key = request.headers.get("X-API-KEY")
    info = await check.info(f"Bearer {key}" if key else None)
    if info is None:
        return DEFAULT_TENANT
    request.state.api_key_id = info.key_id
    if info.require_approval and request.method == "POST":  # a sandbox runs code with no approval on the way
        raise UngatedRoute("an E2B sandbox")
    return info.tenant


# the control plane: the caller is the tenant of its API key (X-API-KEY)
@control.post("/v2/sandboxes", status_code=201, response_model=Sandbox)
async def create(
    request: Request, body: NewSandbox, sandboxes: SandboxesDep, check: KeyCheckDep, traceparent: TraceHeader = None
) -> Sandbox:
    tenant = await _tenant(request, check)
    return await to_thread.run_sync(sandboxes.create, tenant, body, traceparent)


@control.get("/v2/sandboxes", response_model=list[SandboxDetail])
async def list_sandboxes(
    request: Request,
    response: Response,
    sandboxes: SandboxesDep,
    check: KeyCheckDep,
    metadata: Annotated[str | None, Query(max_length=8192)] = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", pattern=r"^\d{1,9}$")] = None,
) -> list[SandboxDetail]:
    tenant = await _tenant(request, check)
    found = await to_thread.run_sync(sandboxes.running, tenant, metadata_filter(metadata))
    start = int(next_token or 0)
    end = len(found) if limit is None else start + limit
    if end < len(found):
        response.headers["x-next-token"] = str(end)  # absent on the last page, or the SDK pages forever
    return found[start:end]


@control.post("/v2/sandboxes/{sandbox_id}/connect", response_model=Sandbox)
async def connect(
    request: Request, sandbox_id: str, sandboxes: SandboxesDep, check: KeyCheckDep, body: ConnectSandbox | None = None
) -> Sandbox:
    tenant = await _tenant(request, check)
    return await to_thread.run_sync(sandboxes.connect, tenant, sandbox_id, body or ConnectSandbox())


@control.get("/sandboxes/{sandbox_id}", response_model=SandboxDetail)
async def get_sandbox(request: Request, sandbox_id: str, sandboxes: SandboxesDep, check: KeyCheckDep) -> SandboxDetail:
    tenant = await _tenant(request, check)
    return await to_thread.run_sync(sandboxes.detail, tenant, sandbox_id)


@control.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(request: Request, sandbox_id: str, sandboxes: SandboxesDep, check: KeyCheckDep) -> Response:
    tenant = await _tenant(request, check)
    await to_thread.run_sync(sandboxes.kill, tenant, sandbox_id)
    return Response(status_code=204)


@control.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(
    request: Request, sandbox_id: str, body: SetTimeout, sandboxes: SandboxesDep, check: KeyCheckDep
) -> Response:
    tenant = await _tenant(request, check)
    await to_thread.run_sync(sandboxes.set_timeout, tenant, sandbox_id, body.timeout)
    return Response(status_code=204)


# the sandbox plane: the caller holds a sandbox id and that sandbox's access token, nothing more
async def _opened(request: Request, sandboxes: Sandboxes, running: bool = True) -> Opened:
    headers = request.headers
    token = headers.get("X-Access-Token") or headers.get("E2B-Traffic-Access-Token")
    opened = await to_thread.run_sync(sandboxes.open, headers.get("E2b-Sandbox-Id"), token)
    if running and not opened.running:
        raise SandboxGone(headers.get("E2b-Sandbox-Id", ""))
    return opened


@sandbox.get("/health", status_code=204)
async def health(request: Request, sandboxes: SandboxesDep) -> Response:
    await _opened(request, sandboxes)
    return Response(status_code=204)


@sandbox.post("/execute")
async def execute(
    request: Request,
    body: Execute,
    sandboxes: SandboxesDep,
    interpreter: InterpreterDep,
    traceparent: TraceHeader = None,
) -> StreamingResponse:
    opened = await _opened(request, sandboxes)
    record = await to_thread.run_sync(interpreter.start, opened, body, traceparent)
    lines = interpreter.lines(opened.entry.tenant, record)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers={"X-Trace-Id": record.trace_id})


@sandbox.get("/contexts", response_model=list[Context])
async def list_contexts(request: Request, interpreter: InterpreterDep, sandboxes: SandboxesDep) -> list[Context]:
    return await to_thread.run_sync(interpreter.contexts, await _opened(request, sandboxes))


@sandbox.post("/contexts", response_model=Context)
async def create_context(
    request: Request, body: NewContext, interpreter: InterpreterDep, sandboxes: SandboxesDep
) -> Context:
    return await interpreter.new_context(await _opened(request, sandboxes), body)


@sandbox.delete("/contexts/{context_id}", status_code=204)
async def remove_context(
    request: Request, context_id: str, interpreter: InterpreterDep, sandboxes: SandboxesDep
) -> Response:
    await interpreter.remove(await _opened(request, sandboxes), context_id)
    return Response(status_code=204)


@sandbox.post("/contexts/{context_id}/restart", status_code=204)
async def restart_context(
    request: Request, context_id: str, interpreter: InterpreterDep, sandboxes: SandboxesDep
) -> Response:
    await interpreter.restart(await _opened(request, sandboxes), context_id)
    return Response(status_code=204)


@sandbox.get("/files")
async def read_file(
    request: Request, envd: EnvdDep, sandboxes: SandboxesDep, path: Annotated[str | None, Query(max_length=4096)] = None
) -> Response:
    data = await filesystem.read(envd, await _opened(request, sandboxes), path)
    return Response(data, media_type="application/octet-stream")


@sandbox.post("/files")
async def write_files(
    request: Request, sandboxes: SandboxesDep, envd: EnvdDep, path: Annotated[str | None, Query(max_length=4096)] = None
) -> JSONResponse:
    """Multipart (field `file`, each part's filename its path; `path` names a single part) or, for
    envd 0.5.7's streamed writes, the raw bytes (gzip-encoded or not) of the one file `path` names."""
    opened = await _opened(request, sandboxes)
    limit = envd.max_file_bytes
    files: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        async with request.form(max_files=64, max_fields=16) as form:
            parts = [part for part in form.getlist("file") if isinstance(part, UploadFile)]
            for part in parts:
                name = path if path is not None and len(parts) == 1 else part.filename
                files.append((name or "", await part.read(limit + 1)))
    else:
        if path is None:
            raise InvalidRequest("path is required", (FieldProblem("path", "where to write the body"),))
        data = await request.body()
        if request.headers.get("content-encoding", "").lower() == "gzip":
            data = filesystem.gunzip(data, limit)
        files.append((path, data))
    return JSONResponse(await filesystem.write(envd, opened, files))


SERVER_STREAMS = frozenset(
    {("process.Process", "Start"), ("process.Process", "Connect"), ("filesystem.Filesystem", "WatchDir")}
)
"""The server-streaming RPCs: one enveloped request, a stream of envelopes back."""


@sandbox.post("/{service}/{method}")
async def rpc(
    request: Request, service: str, method: str, sandboxes: SandboxesDep, envd: EnvdDep, watch_book: WatchersDep
) -> Response:
    """Connect RPCs, JSON codec: unary calls answer JSON, Start and Connect stream envelopes."""
    opened = await _opened(request, sandboxes)
    if (service, method) in SERVER_STREAMS:
        try:
            body = await to_thread.run_sync(connectrpc.opened_envelope, await request.body(), limiter=PARSES)
        except ServiceError as exc:
            return Response(connectrpc.end_stream(connectrpc.connect_code(exc.http_status), exc.message),
                            media_type=connectrpc.STREAM_TYPE)  # fmt: skip
        if method == "WatchDir":
            frames = watchers.stream(envd, opened, body)
        else:
            frames = commands.stream(envd, opened, method, body, request.headers.get("Connect-Timeout-Ms"))
        return StreamingResponse(frames, media_type=connectrpc.STREAM_TYPE)
    if service == "process.Process" and method == "StreamInput":
        answer = await commands.stream_input(envd, opened, request.stream())
        return Response(answer, media_type=connectrpc.STREAM_TYPE)
    body = await to_thread.run_sync(connectrpc.message, await request.body(), limiter=PARSES)  # off the loop
    if service == "filesystem.Filesystem" and method in watchers.UNARY:
        return JSONResponse(await watchers.rpc(envd, watch_book, opened, method, body))
    if service == "process.Process":
        return JSONResponse(await commands.rpc(envd, opened, method, body))
    if service == "filesystem.Filesystem":
        return JSONResponse(await filesystem.rpc(envd, opened, method, body))
    raise NotOffered(f"no RPC service {service[:64]!r}")
