"""A client of the execbox REST API, sync (`Client`) and async (`AsyncClient`), on httpx.

Every endpoint method is written once, in `Endpoints`, as a description of its request (`Call`);
each client sends it its own way, so `Client.get_execution(...)` returns the execution and
`AsyncClient.get_execution(...)` a coroutine of it. What each answers is typed
(execbox_client.types: TypedDicts of the server's JSON; the values stay plain dicts). Both:

- send a W3C `traceparent` with every request (a new trace per call unless one is given) and an
  `Idempotency-Key` with every creation the service deduplicates, the same key on its retries;
- retry only what is safe to repeat (reads, deletes, creations carrying their key) and only when
  retrying can help (connection errors, 429 and 503), honouring `Retry-After`, with backoff;
- turn problem documents into typed exceptions (execbox_client.errors) that carry the fields at fault;
- wait for executions with the server's blocking wait (`?wait=`), never by polling on a timer;
- stream an execution's live events as an iterator that resumes with `Last-Event-ID`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload
from urllib.parse import quote

import httpx

from execbox_client.errors import ExecboxError, InvalidRequest, error_for
from execbox_client.types import (
    ApprovalPublic,
    ExecutionPublic,
    FilePublic,
    Firing,
    Handoff,
    LanguagePublic,
    LanguagesPublic,
    RunPublic,
    RunRecord,
    Schedule,
    ScriptDetail,
    ScriptSummary,
    ScriptVersion,
    SessionList,
    SessionPublic,
    Surprise,
    Validation,
)

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired", "unknown_outcome"})
"""An execution in one of these has stopped: `unknown_outcome` waits for reconcile_execution, not for a worker."""
RETRIED_STATUSES = frozenset({429, 503})
SERVER_WAIT_S = 60.0
"""The longest `?wait=` the service accepts; longer waits are several of them."""
STREAM_TIMEOUT = httpx.Timeout(None, connect=10.0)
"""A live stream may be quiet for long (the server sends keepalives), so only connecting is timed."""


@dataclass(frozen=True)
class Event:
    """One live event of an execution: `stdout`, `stderr`, `result`, `status` or the final `end`
    (whose `data` is the finished execution)."""

    id: str
    event: str
    data: Any


@dataclass
class Call(Generic[T]):
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    files: dict[str, Any] | None = None
    creates: bool = False
    """Creates something the service deduplicates by Idempotency-Key (executions, files, runs,
    script invocations): sent with one, which makes it safe to retry."""
    idempotency_key: str | None = None
    raw: bool = False
    """Answer with the body's bytes (downloads) rather than its JSON. T is what the answer is, for the
    type checker only: the JSON is not validated against it."""

    def headers(self, traceparent: str | None) -> dict[str, str]:
        headers = {"traceparent": traceparent or new_traceparent()}
        if self.creates:
            self.idempotency_key = self.idempotency_key or str(uuid.uuid4())
            headers["Idempotency-Key"] = self.idempotency_key
        return headers

    @property
    def safe(self) -> bool:
        return self.method in ("GET", "HEAD", "PUT", "DELETE") or self.creates

    def answer(self, response: httpx.Response) -> T:
        if self.raw:
            return cast(T, response.content)
        return cast(T, response.json() if response.content else None)


_RESUME: Call[None] = Call("GET", "")
"""Resuming a live stream: a read, safe to repeat."""


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def _backoff_s(attempt: int, error: ExecboxError | None) -> float:
    if error is not None and error.retry_after is not None:
        return min(error.retry_after, 60.0)
    return min(0.2 * 2.0**attempt, 5.0) * (0.5 + random.random() / 2)  # jitter, not secrecy


def _wait(wait_s: float | None) -> dict[str, Any]:
    return {} if wait_s is None else {"wait": min(max(wait_s, 0.0), SERVER_WAIT_S)}


def _one(field: str, value: str) -> str:
    """A path parameter as exactly one segment of the URL: quoted whole (`?`, `#`, `%` included), and
    refused when no quoting can keep it one (a `/`, a dot segment, a control character), so that no
    value reaches another route than its method's (an MCP tool's argument is an agent's text)."""
    problem = _segment_problem(value)
    if problem is not None:
        raise InvalidRequest(422, {"code": "request.invalid", "detail": f"{field}: {problem}",
                                   "errors": [{"field": f"path.{field}", "message": problem}]})  # fmt: skip
    return quote(value, safe="{}")  # httpx encodes braces itself; left so a path template reads as one


def _segment_problem(value: object) -> str | None:
    if not isinstance(value, str) or value in ("", ".", ".."):
        return f"{str(value)[:60]!r} is not an id or a name"
    if "/" in value:
        return f"{value[:60]!r} holds a `/`; give the id or name alone"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"{value[:60]!r} holds a control character"
    return None


def _path(field: str, value: str) -> str:
    """A path parameter that may have several segments (an artifact's name): each one as _one's."""
    return "/".join(_one(field, part) for part in str(value).split("/"))


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Endpoint(Protocol[P, T_co]):
    """An endpoint method as the type checker sees it: read from a `Client` it answers T, from an
    `AsyncClient` a coroutine of T (one definition for both, which no plain signature can say)."""

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Callable[Concatenate[Endpoints, P], Any]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T_co]]: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, T_co]: ...
    @overload
    def __get__(self, client: Endpoints, owner: type[Any]) -> Callable[P, Any]: ...


def endpoint(build: Callable[Concatenate[Any, P], Call[T]]) -> Endpoint[P, T]:
    """The method that sends the call `build` describes; at run time a plain function, as before."""

    @functools.wraps(build)
    def send(self: Endpoints, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self._send(build(self, *args, **kwargs))

    return cast("Endpoint[P, T]", send)


class Endpoints:
    """Every endpoint of the API, as the call it makes."""

    def _send(self, call: Call[Any]) -> Any:
        raise NotImplementedError

    # -- executions ------------------------------------------------------------------------
    @endpoint
    def submit(self, /, code: str, language: str = "python", *, wait_s: float | None = None,
               idempotency_key: str | None = None, **fields: Any) -> Call[ExecutionPublic]:  # fmt: skip
        """Queue code (fields: policy, env, files, inputs, outputs, expect, session, session_context,
        labels, webhook, stdin_b64); with `wait_s`, the server holds the answer until it ends or the time is up."""
        body = {"language": language, "code": code, **fields}
        return Call("POST", "/v1/executions", _wait(wait_s), body, creates=True,
                                idempotency_key=idempotency_key)  # fmt: skip

    @endpoint
    def get_execution(self, execution_id: str, *, wait_s: float | None = None) -> Call[ExecutionPublic]:
        return Call("GET", f"/v1/executions/{_one('execution_id', execution_id)}", _wait(wait_s))

    @endpoint
    def get_execution_record(self, execution_id: str) -> Call[RunRecord]:
        """The run record: request and code hashes, policy, image, worker, transitions, resources, outcome."""
        return Call("GET", f"/v1/executions/{_one('execution_id', execution_id)}/record")

    @endpoint
    def cancel_execution(self, execution_id: str) -> Call[ExecutionPublic]:
        return Call("POST", f"/v1/executions/{_one('execution_id', execution_id)}/cancel")

    @endpoint
    def reconcile_execution(self, execution_id: str, body: dict[str, Any]) -> Call[ExecutionPublic]:
        """Settle an `unknown_outcome`: {"outcome": "applied" | "not_applied", "reason", "outputs"}."""
        return Call("POST", f"/v1/executions/{_one('execution_id', execution_id)}/reconcile", json=body)

    @endpoint
    def artifact(self, execution_id: str, name: str) -> Call[bytes]:
        """An artifact's bytes."""
        return Call(
            "GET", f"/v1/executions/{_one('execution_id', execution_id)}/artifacts/{_path('name', name)}", raw=True
        )

    @endpoint
    def result_file(self, execution_id: str, file: str) -> Call[bytes]:
        """A rich result's representation (an image/png, a text/html) by the file name its URL ends in."""
        return Call(
            "GET", f"/v1/executions/{_one('execution_id', execution_id)}/results/{_one('file', file)}", raw=True
        )

    @endpoint
    def download(self, url: str) -> Call[bytes]:
        """The bytes behind an artifact's or result's `url` (absolute or relative to the service)."""
        return Call("GET", httpx.URL(url).raw_path.decode("ascii"), raw=True)

    # -- files -----------------------------------------------------------------------------
    @endpoint
    def upload_file(self, name: str, data: bytes, *, idempotency_key: str | None = None) -> Call[FilePublic]:
        return Call("POST", "/v1/files", files={"file": (name, data)}, creates=True,
                                idempotency_key=idempotency_key)  # fmt: skip

    @endpoint
    def get_file(self, file_id: str) -> Call[FilePublic]:
        return Call("GET", f"/v1/files/{_one('file_id', file_id)}")

    # -- sessions --------------------------------------------------------------------------
    @endpoint
    def create_session(self, /, language: str = "python", **fields: Any) -> Call[SessionPublic]:
        """Fields: policy, files, env, idle_timeout_s, max_lifetime_s, labels."""
        return Call("POST", "/v1/sessions", json={"language": language, **fields})

    @endpoint
    def get_session(self, session_id: str) -> Call[SessionPublic]:
        return Call("GET", f"/v1/sessions/{_one('session_id', session_id)}")

    @endpoint
    def list_sessions(self, status: str | None = None) -> Call[SessionList]:
        return Call("GET", "/v1/sessions", _drop_none(status=status))

    @endpoint
    def delete_session(self, session_id: str) -> Call[SessionPublic]:
        return Call("DELETE", f"/v1/sessions/{_one('session_id', session_id)}")

    # -- languages and health --------------------------------------------------------------
    @endpoint
    def languages(self) -> Call[LanguagesPublic]:
        return Call("GET", "/v1/languages")

    @endpoint
    def language(self, name: str) -> Call[LanguagePublic]:
        return Call("GET", f"/v1/languages/{_one('name', name)}")

    @endpoint
    def healthz(self) -> Call[dict[str, str]]:
        return Call("GET", "/healthz")

    @endpoint
    def readyz(self) -> Call[dict[str, Any]]:
        return Call("GET", "/readyz")

    # -- plans, runs and approvals ---------------------------------------------------------
    @endpoint
    def validate_plan(self, plan: dict[str, Any]) -> Call[Validation]:
        return Call("POST", "/v1/plans/validate", json=plan)

    @endpoint
    def start_run(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> Call[RunPublic]:
        """A plan run: body as POST /v1/runs takes it (the plan, inputs, budgets)."""
        return Call("POST", "/v1/runs", json=body, creates=True, idempotency_key=idempotency_key)

    @endpoint
    def list_runs(self, /, **params: Any) -> Call[list[RunPublic]]:
        return Call("GET", "/v1/runs", _drop_none(**params))

    @endpoint
    def get_run(self, run_id: str, *, wait_s: float | None = None, after: int | None = None) -> Call[RunPublic]:
        """With `wait_s`, the run once it stops running; with `after` too, as soon as it has more
        than that many events (a step changed)."""
        params = _wait(wait_s) | ({} if after is None else {"after": after})
        return Call("GET", f"/v1/runs/{_one('run_id', run_id)}", params)

    @endpoint
    def run_handoff(self, run_id: str) -> Call[Handoff]:
        """What a run that needs a re-plan hands back to the planner."""
        return Call("GET", f"/v1/runs/{_one('run_id', run_id)}/handoff")

    @endpoint
    def revise_run(self, run_id: str, body: dict[str, Any]) -> Call[RunPublic]:
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/revisions", json=body)

    @endpoint
    def cancel_run(self, run_id: str, *, compensate: bool = False, reason: str | None = None) -> Call[RunPublic]:
        """Stop a run; with `compensate`, then undo its succeeded writes in reverse order."""
        body = {"compensate": compensate, **({"reason": reason} if reason else {})}
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/cancel", json=body)

    @endpoint
    def compensate_run(self, run_id: str, reason: str) -> Call[RunPublic]:
        """Undo a run's succeeded writes (an unfinished run is abandoned first); resumes a stopped one."""
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/compensate", json={"reason": reason})

    @endpoint
    def reconcile_step(self, run_id: str, step_id: str, body: dict[str, Any]) -> Call[RunPublic]:
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/steps/{_one('step_id', step_id)}/reconcile", json=body)

    @endpoint
    def report_usage(self, run_id: str, body: dict[str, Any]) -> Call[RunPublic]:
        """One model call of the agent's: model, role, input_tokens, output_tokens, cost_usd,
        latency_ms and an optional call_id (reported twice, counted once)."""
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/usage", json=body)

    @endpoint
    def supply_input(self, run_id: str, step_id: str, value: dict[str, Any], supplied_by: str = "") -> Call[RunPublic]:
        """The value an input step waits for (`awaiting_input`); checked against its schema (422)."""
        body = {"value": value, "supplied_by": supplied_by}
        return Call("POST", f"/v1/runs/{_one('run_id', run_id)}/steps/{_one('step_id', step_id)}/input", json=body)

    @endpoint
    def list_approvals(self, /, **params: Any) -> Call[list[ApprovalPublic]]:
        return Call("GET", "/v1/approvals", _drop_none(**params))

    @endpoint
    def get_approval(self, approval_id: str) -> Call[ApprovalPublic]:
        return Call("GET", f"/v1/approvals/{_one('approval_id', approval_id)}")

    @endpoint
    def decide_approval(self, approval_id: str, body: dict[str, Any]) -> Call[ApprovalPublic]:
        return Call("POST", f"/v1/approvals/{_one('approval_id', approval_id)}/decision", json=body)

    # -- scripts and schedules -------------------------------------------------------------
    @endpoint
    def register_script(self, body: dict[str, Any]) -> Call[ScriptVersion]:
        return Call("POST", "/v1/scripts", json=body)

    @endpoint
    def list_scripts(self, /, **params: Any) -> Call[list[ScriptSummary]]:
        return Call("GET", "/v1/scripts", _drop_none(**params))

    @endpoint
    def get_script(self, name: str) -> Call[ScriptDetail]:
        return Call("GET", f"/v1/scripts/{_one('name', name)}")

    @endpoint
    def get_script_version(self, name: str, version: str) -> Call[ScriptVersion]:
        return Call("GET", f"/v1/scripts/{_one('name', name)}/versions/{_one('version', version)}")

    @endpoint
    def promote_script(self, name: str, version: str, body: dict[str, Any] | None = None) -> Call[ScriptVersion]:
        return Call(
            "POST", f"/v1/scripts/{_one('name', name)}/versions/{_one('version', version)}/promote", json=body or {}
        )

    @endpoint
    def invoke_script(
        self, name: str, body: dict[str, Any] | None = None, *, wait_s: float | None = None
    ) -> Call[ExecutionPublic]:
        """Run a version of a script (body: version, inputs, files, labels); `wait_s` as for submit."""
        return Call("POST", f"/v1/scripts/{_one('name', name)}/invoke", _wait(wait_s), body or {}, creates=True)

    @endpoint
    def create_schedule(self, body: dict[str, Any]) -> Call[Schedule]:
        return Call("POST", "/v1/schedules", json=body)

    @endpoint
    def list_schedules(self, /, **params: Any) -> Call[list[Schedule]]:
        return Call("GET", "/v1/schedules", _drop_none(**params))

    @endpoint
    def get_schedule(self, schedule_id: str) -> Call[Schedule]:
        return Call("GET", f"/v1/schedules/{_one('schedule_id', schedule_id)}")

    @endpoint
    def update_schedule(self, schedule_id: str, body: dict[str, Any]) -> Call[Schedule]:
        return Call("PATCH", f"/v1/schedules/{_one('schedule_id', schedule_id)}", json=body)

    @endpoint
    def pause_schedule(self, schedule_id: str) -> Call[Schedule]:
        return Call("POST", f"/v1/schedules/{_one('schedule_id', schedule_id)}/pause")

    @endpoint
    def resume_schedule(self, schedule_id: str) -> Call[Schedule]:
        return Call("POST", f"/v1/schedules/{_one('schedule_id', schedule_id)}/resume")

    @endpoint
    def delete_schedule(self, schedule_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/schedules/{_one('schedule_id', schedule_id)}")

    @endpoint
    def schedule_firings(self, schedule_id: str) -> Call[list[Firing]]:
        return Call("GET", f"/v1/schedules/{_one('schedule_id', schedule_id)}/firings")

    @endpoint
    def list_events(self, /, **params: Any) -> Call[list[Surprise]]:
        """The surprises scripts raised (params: type, since), for the conversation to resume on."""
        return Call("GET", "/v1/events", _drop_none(**params))


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    url = base_url or os.environ.get("EXECBOX_URL") or "http://127.0.0.1:8000"
    key = api_key if api_key is not None else os.environ.get("EXECBOX_API_KEY")
    return url, ({"Authorization": f"Bearer {key}"} if key else {})


def _retry_delay(call: Call[Any], attempt: int, error: ExecboxError | None, max_retries: int) -> float:
    """How long to wait before trying `call` again after `error` (None: the connection failed);
    re-raises when a retry is not safe or cannot help."""
    if error is not None and (error.status not in RETRIED_STATUSES or not call.safe or attempt >= max_retries):
        raise error
    if error is None and (not call.safe or attempt >= max_retries):
        raise  # the transport error being handled (called from its except clause)
    return _backoff_s(attempt, error)


def _event_headers(traceparent: str | None, last_event_id: str | None) -> dict[str, str]:
    headers = {"traceparent": traceparent or new_traceparent(), "Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


def _event(sse: Any) -> Event:
    return Event(sse.id, sse.event, json.loads(sse.data) if sse.data else None)


class Client(Endpoints):
    """Sync client. `base_url` and `api_key` default to EXECBOX_URL and EXECBOX_API_KEY."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout_s: float = 120.0,
                 max_retries: int = 4, traceparent: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:  # fmt: skip
        url, headers = _settings(base_url, api_key)
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout_s, transport=transport)
        self._max_retries = max_retries
        self.traceparent = traceparent
        """Sent with every request when set (joins the caller's trace); otherwise a new one per call."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call[T]) -> T:
        attempts = itertools.count()
        while True:  # until answered, or _retry_delay gives up and raises
            attempt = next(attempts)
            try:
                headers = call.headers(self.traceparent)
                response = self._http.request(call.method, call.path, params=call.params, json=call.json,
                                              files=call.files, headers=headers)  # fmt: skip
            except httpx.TransportError:
                time.sleep(_retry_delay(call, attempt, None, self._max_retries))
                continue
            if response.status_code < 400:
                return call.answer(response)
            time.sleep(_retry_delay(call, attempt, error_for(response), self._max_retries))

    def run(self, code: str, language: str = "python", *, wait_s: float = 600.0, **fields: Any) -> ExecutionPublic:
        """Submit and wait until the execution ends (or `wait_s` passes: then it is returned as it is)."""
        deadline = time.monotonic() + wait_s
        execution = self.submit(code, language, wait_s=wait_s, **fields)
        while execution["status"] not in TERMINAL and (left := deadline - time.monotonic()) > 0:
            execution = self.get_execution(execution["id"], wait_s=left)
        return execution

    def events(self, execution_id: str, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The execution's live events, from the start (or after `last_event_id`) to its `end`; a
        dropped connection is resumed where it broke."""
        from httpx_sse import connect_sse

        path = f"/v1/executions/{_one('execution_id', execution_id)}/events"
        for resumed in itertools.count():
            headers = _event_headers(self.traceparent, last_event_id)
            try:
                with connect_sse(self._http, "GET", path, headers=headers,
                                 timeout=STREAM_TIMEOUT) as source:  # fmt: skip
                    if source.response.status_code >= 400:
                        source.response.read()
                        raise error_for(source.response)
                    for sse in source.iter_sse():
                        last_event_id = sse.id or last_event_id
                        yield _event(sse)
                        if sse.event == "end":
                            return
            except httpx.TransportError:
                time.sleep(_retry_delay(_RESUME, resumed, None, self._max_retries))


class AsyncClient(Endpoints):
    """Async client: the same methods as Client, each a coroutine (events: an async iterator)."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout_s: float = 120.0,
                 max_retries: int = 4, traceparent: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:  # fmt: skip
        url, headers = _settings(base_url, api_key)
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, transport=transport)
        self._max_retries = max_retries
        self.traceparent = traceparent

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        attempts = itertools.count()
        while True:  # until answered, or _retry_delay gives up and raises
            attempt = next(attempts)
            try:
                headers = call.headers(self.traceparent)
                response = await self._http.request(call.method, call.path, params=call.params, json=call.json,
                                                    files=call.files, headers=headers)  # fmt: skip
            except httpx.TransportError:
                await asyncio.sleep(_retry_delay(call, attempt, None, self._max_retries))
                continue
            if response.status_code < 400:
                return call.answer(response)
            await asyncio.sleep(_retry_delay(call, attempt, error_for(response), self._max_retries))

    async def run(
        self, code: str, language: str = "python", *, wait_s: float = 600.0, **fields: Any
    ) -> ExecutionPublic:
        deadline = time.monotonic() + wait_s
        execution = await self.submit(code, language, wait_s=wait_s, **fields)
        while execution["status"] not in TERMINAL and (left := deadline - time.monotonic()) > 0:
            execution = await self.get_execution(execution["id"], wait_s=left)
        return execution

    async def events(self, execution_id: str, *, last_event_id: str | None = None) -> AsyncIterator[Event]:
        from httpx_sse import aconnect_sse

        path = f"/v1/executions/{_one('execution_id', execution_id)}/events"
        for resumed in itertools.count():
            headers = _event_headers(self.traceparent, last_event_id)
            try:
                async with aconnect_sse(self._http, "GET", path,
                                        headers=headers, timeout=STREAM_TIMEOUT) as source:  # fmt: skip
                    if source.response.status_code >= 400:
                        await source.response.aread()
                        raise error_for(source.response)
                    async for sse in source.aiter_sse():
                        last_event_id = sse.id or last_event_id
                        yield _event(sse)
                        if sse.event == "end":
                            return
            except httpx.TransportError:
                await asyncio.sleep(_retry_delay(_RESUME, resumed, None, self._max_retries))
