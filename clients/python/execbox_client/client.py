"""A client of the execbox REST API, sync (`Client`) and async (`AsyncClient`), on httpx.

Every endpoint method is written once, in `Endpoints`, as a description of its request (`Call`);
each client sends it its own way, so `Client.get_execution(...)` returns the execution and
`AsyncClient.get_execution(...)` a coroutine of it. Both:

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
import itertools
import json
import os
import random
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from execbox_client.errors import ExecboxError, error_for

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
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
class Call:
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
    """Answer with the body's bytes (downloads) rather than its JSON."""

    def headers(self, traceparent: str | None) -> dict[str, str]:
        headers = {"traceparent": traceparent or new_traceparent()}
        if self.creates:
            self.idempotency_key = self.idempotency_key or str(uuid.uuid4())
            headers["Idempotency-Key"] = self.idempotency_key
        return headers

    @property
    def safe(self) -> bool:
        return self.method in ("GET", "HEAD", "PUT", "DELETE") or self.creates

    def answer(self, response: httpx.Response) -> Any:
        if self.raw:
            return response.content
        return response.json() if response.content else None


_RESUME = Call("GET", "")
"""Resuming a live stream: a read, safe to repeat."""


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def _backoff_s(attempt: int, error: ExecboxError | None) -> float:
    if error is not None and error.retry_after is not None:
        return min(error.retry_after, 60.0)
    return min(0.2 * 2.0**attempt, 5.0) * (0.5 + random.random() / 2)  # jitter, not secrecy


def _wait(wait_s: float | None) -> dict[str, Any]:
    return {} if wait_s is None else {"wait": min(max(wait_s, 0.0), SERVER_WAIT_S)}


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class Endpoints:
    """Every endpoint of the API, as the call it makes."""

    def _send(self, call: Call) -> Any:
        raise NotImplementedError

    # -- executions ------------------------------------------------------------------------
    def submit(self, code: str, language: str = "python", *, wait_s: float | None = None,
               idempotency_key: str | None = None, **fields: Any) -> Any:  # fmt: skip
        """Queue code (fields: policy, env, files, inputs, outputs, expect, session, labels,
        webhook, stdin_b64); with `wait_s`, the server holds the answer until it ends or the time is up."""
        body = {"language": language, "code": code, **fields}
        return self._send(Call("POST", "/v1/executions", _wait(wait_s), body, creates=True,
                                idempotency_key=idempotency_key))  # fmt: skip

    def get_execution(self, execution_id: str, *, wait_s: float | None = None) -> Any:
        return self._send(Call("GET", f"/v1/executions/{execution_id}", _wait(wait_s)))

    def get_execution_record(self, execution_id: str) -> Any:
        """The run record: request and code hashes, policy, image, worker, transitions, resources, outcome."""
        return self._send(Call("GET", f"/v1/executions/{execution_id}/record"))

    def cancel_execution(self, execution_id: str) -> Any:
        return self._send(Call("POST", f"/v1/executions/{execution_id}/cancel"))

    def artifact(self, execution_id: str, name: str) -> Any:
        """An artifact's bytes."""
        return self._send(Call("GET", f"/v1/executions/{execution_id}/artifacts/{name}", raw=True))

    def result_file(self, execution_id: str, file: str) -> Any:
        """A rich result's representation (an image/png, a text/html) by the file name its URL ends in."""
        return self._send(Call("GET", f"/v1/executions/{execution_id}/results/{file}", raw=True))

    def download(self, url: str) -> Any:
        """The bytes behind an artifact's or result's `url` (absolute or relative to the service)."""
        return self._send(Call("GET", httpx.URL(url).raw_path.decode("ascii"), raw=True))

    # -- files -----------------------------------------------------------------------------
    def upload_file(self, name: str, data: bytes, *, idempotency_key: str | None = None) -> Any:
        return self._send(Call("POST", "/v1/files", files={"file": (name, data)}, creates=True,
                                idempotency_key=idempotency_key))  # fmt: skip

    def get_file(self, file_id: str) -> Any:
        return self._send(Call("GET", f"/v1/files/{file_id}"))

    # -- sessions --------------------------------------------------------------------------
    def create_session(self, language: str = "python", **fields: Any) -> Any:
        """Fields: policy, files, env, idle_timeout_s, max_lifetime_s, labels."""
        return self._send(Call("POST", "/v1/sessions", json={"language": language, **fields}))

    def get_session(self, session_id: str) -> Any:
        return self._send(Call("GET", f"/v1/sessions/{session_id}"))

    def list_sessions(self, status: str | None = None) -> Any:
        return self._send(Call("GET", "/v1/sessions", _drop_none(status=status)))

    def delete_session(self, session_id: str) -> Any:
        return self._send(Call("DELETE", f"/v1/sessions/{session_id}"))

    # -- languages and health --------------------------------------------------------------
    def languages(self) -> Any:
        return self._send(Call("GET", "/v1/languages"))

    def language(self, name: str) -> Any:
        return self._send(Call("GET", f"/v1/languages/{name}"))

    def healthz(self) -> Any:
        return self._send(Call("GET", "/healthz"))

    def readyz(self) -> Any:
        return self._send(Call("GET", "/readyz"))

    # -- plans, runs and approvals ---------------------------------------------------------
    def validate_plan(self, plan: dict[str, Any]) -> Any:
        return self._send(Call("POST", "/v1/plans/validate", json=plan))

    def start_run(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> Any:
        """A plan run: body as POST /v1/runs takes it (the plan, inputs, budgets)."""
        return self._send(Call("POST", "/v1/runs", json=body, creates=True, idempotency_key=idempotency_key))

    def list_runs(self, **params: Any) -> Any:
        return self._send(Call("GET", "/v1/runs", _drop_none(**params)))

    def get_run(self, run_id: str, *, wait_s: float | None = None, after: int | None = None) -> Any:
        """With `wait_s`, the run once it stops running; with `after` too, as soon as it has more
        than that many events (a step changed)."""
        params = _wait(wait_s) | ({} if after is None else {"after": after})
        return self._send(Call("GET", f"/v1/runs/{run_id}", params))

    def run_handoff(self, run_id: str) -> Any:
        """What a run that needs a re-plan hands back to the planner."""
        return self._send(Call("GET", f"/v1/runs/{run_id}/handoff"))

    def revise_run(self, run_id: str, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", f"/v1/runs/{run_id}/revisions", json=body))

    def cancel_run(self, run_id: str) -> Any:
        return self._send(Call("POST", f"/v1/runs/{run_id}/cancel"))

    def reconcile_step(self, run_id: str, step_id: str, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", f"/v1/runs/{run_id}/steps/{step_id}/reconcile", json=body))

    def report_usage(self, run_id: str, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", f"/v1/runs/{run_id}/usage", json=body))

    def list_approvals(self, **params: Any) -> Any:
        return self._send(Call("GET", "/v1/approvals", _drop_none(**params)))

    def get_approval(self, approval_id: str) -> Any:
        return self._send(Call("GET", f"/v1/approvals/{approval_id}"))

    def decide_approval(self, approval_id: str, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", f"/v1/approvals/{approval_id}/decision", json=body))

    # -- scripts and schedules -------------------------------------------------------------
    def register_script(self, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", "/v1/scripts", json=body))

    def list_scripts(self, **params: Any) -> Any:
        return self._send(Call("GET", "/v1/scripts", _drop_none(**params)))

    def get_script(self, name: str) -> Any:
        return self._send(Call("GET", f"/v1/scripts/{name}"))

    def get_script_version(self, name: str, version: str) -> Any:
        return self._send(Call("GET", f"/v1/scripts/{name}/versions/{version}"))

    def promote_script(self, name: str, version: str, body: dict[str, Any] | None = None) -> Any:
        return self._send(Call("POST", f"/v1/scripts/{name}/versions/{version}/promote", json=body or {}))

    def invoke_script(self, name: str, body: dict[str, Any] | None = None, *, wait_s: float | None = None) -> Any:
        """Run a version of a script (body: version, inputs, files, labels); `wait_s` as for submit."""
        return self._send(Call("POST", f"/v1/scripts/{name}/invoke", _wait(wait_s), body or {}, creates=True))

    def create_schedule(self, body: dict[str, Any]) -> Any:
        return self._send(Call("POST", "/v1/schedules", json=body))

    def list_schedules(self, **params: Any) -> Any:
        return self._send(Call("GET", "/v1/schedules", _drop_none(**params)))

    def get_schedule(self, schedule_id: str) -> Any:
        return self._send(Call("GET", f"/v1/schedules/{schedule_id}"))

    def update_schedule(self, schedule_id: str, body: dict[str, Any]) -> Any:
        return self._send(Call("PATCH", f"/v1/schedules/{schedule_id}", json=body))

    def pause_schedule(self, schedule_id: str) -> Any:
        return self._send(Call("POST", f"/v1/schedules/{schedule_id}/pause"))

    def resume_schedule(self, schedule_id: str) -> Any:
        return self._send(Call("POST", f"/v1/schedules/{schedule_id}/resume"))

    def delete_schedule(self, schedule_id: str) -> Any:
        return self._send(Call("DELETE", f"/v1/schedules/{schedule_id}"))

    def schedule_firings(self, schedule_id: str) -> Any:
        return self._send(Call("GET", f"/v1/schedules/{schedule_id}/firings"))

    def list_events(self, **params: Any) -> Any:
        """The surprises scripts raised (params: type, since), for the conversation to resume on."""
        return self._send(Call("GET", "/v1/events", _drop_none(**params)))


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    url = base_url or os.environ.get("EXECBOX_URL") or "http://127.0.0.1:8000"
    key = api_key if api_key is not None else os.environ.get("EXECBOX_API_KEY")
    return url, ({"Authorization": f"Bearer {key}"} if key else {})


def _retry_delay(call: Call, attempt: int, error: ExecboxError | None, max_retries: int) -> float:
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

    def _send(self, call: Call) -> Any:
        for attempt in itertools.count():
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

    def run(self, code: str, language: str = "python", *, wait_s: float = 600.0, **fields: Any) -> dict[str, Any]:
        """Submit and wait until the execution ends (or `wait_s` passes: then it is returned as it is)."""
        deadline = time.monotonic() + wait_s
        execution: dict[str, Any] = self.submit(code, language, wait_s=wait_s, **fields)
        while execution["status"] not in TERMINAL and (left := deadline - time.monotonic()) > 0:
            execution = self.get_execution(execution["id"], wait_s=left)
        return execution

    def events(self, execution_id: str, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The execution's live events, from the start (or after `last_event_id`) to its `end`; a
        dropped connection is resumed where it broke."""
        from httpx_sse import connect_sse

        for resumed in itertools.count():
            headers = _event_headers(self.traceparent, last_event_id)
            try:
                with connect_sse(self._http, "GET", f"/v1/executions/{execution_id}/events", headers=headers,
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

    async def _send(self, call: Call) -> Any:
        for attempt in itertools.count():
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

    async def run(self, code: str, language: str = "python", *, wait_s: float = 600.0, **fields: Any) -> Any:
        deadline = time.monotonic() + wait_s
        execution: dict[str, Any] = await self.submit(code, language, wait_s=wait_s, **fields)
        while execution["status"] not in TERMINAL and (left := deadline - time.monotonic()) > 0:
            execution = await self.get_execution(execution["id"], wait_s=left)
        return execution

    async def events(self, execution_id: str, *, last_event_id: str | None = None) -> AsyncIterator[Event]:
        from httpx_sse import aconnect_sse

        for resumed in itertools.count():
            headers = _event_headers(self.traceparent, last_event_id)
            try:
                async with aconnect_sse(self._http, "GET", f"/v1/executions/{execution_id}/events",
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
