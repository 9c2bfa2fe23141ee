"""Request bodies bounded per route before they are parsed, and read within deadlines.

Each route takes at most what its fields can legitimately hold (`RouteBounds`): POST
/v1/executions the policies' highest code, stdin, input files and inputs ceilings (base64 counted)
up to api.max_body_bytes; the other upload routes api.max_body_bytes; a route with a JSON model
api.max_json_body_bytes; a route of a few short fields (a decision, a cancel, a key) SMALL_BODY_BYTES;
a route that takes no body NO_BODY_BYTES. A Content-Length above the route's bound is a 413 naming
it before a byte is read; a chunked body is counted as it arrives. While the body is read, each
chunk must come within api.body_idle_timeout_s and the whole body within its deadline (the idle
timeout plus what the declared length, or the route's bound, takes at api.body_min_rate_bytes_s):
past either, 408 and the connection is closed, so "40 of 60 MiB, then nothing" holds nothing for
long. The head's own deadline and the bound on connections are the server's (api.server).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
from fastapi.routing import APIRoute
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from execbox.api.problems import UPLOADS, ForeignShape, problem_response
from execbox.catalog.policies import PolicySet
from execbox.core.errors import BodyTooLarge
from execbox.settings import ApiSettings

NO_BODY_BYTES = 4 * 1024
"""A route that reads no body (a cancel of an execution, a pause, a drain): `{}` and some slack."""
SMALL_BODY_BYTES = 32 * 1024
"""A route of a few short fields: a 4,000-character reason written as JSON escapes is 24 KiB."""
SMALL_ROUTES = frozenset({
    ("POST", "/v1/runs/{run_id}/cancel"), ("POST", "/v1/runs/{run_id}/compensate"),
    ("POST", "/v1/approvals/{approval_id}/decision"), ("POST", "/v1/scripts/{name}/versions/{version}/promote"),
    ("POST", "/v1/admin/keys"), ("POST", "/v1/admin/scripts/{name}/versions/{version}/promote"),
    ("POST", "/console/signin"), ("POST", "/console/signout"), ("POST", "/console/approvals/{approval_id}/decision"),
    ("POST", "/console/operators/dead-letters/{loop}/{letter_id}"),
    ("POST", "/e2b/v2/sandboxes/{sandbox_id}/connect"), ("POST", "/e2b/sandboxes/{sandbox_id}/timeout"),
    ("POST", "/e2b/sandbox/contexts"),
})  # fmt: skip
"""Routes whose body model holds only a few bounded fields."""
READS_ITS_BODY = frozenset({("POST", "/e2b/sandbox/{service}/{method}")})
"""Routes without a declared body model that read one (Connect RPCs): the JSON bound."""
STREAMS = frozenset({"/e2b/sandbox/process.Process/StreamInput"})
"""Client streams: a program's standard input for as long as it runs, so no body deadline."""
_SLACK = 1024 * 1024
"""Beyond the sum of an execution's ceilings: env (64 × 4 KiB), labels, policy, JSON punctuation."""


def execution_bound(policies: PolicySet, cap: int) -> int:
    """POST /v1/executions: code, stdin (base64), input files (base64) and inputs at the highest
    ceilings any policy allows, plus slack; never above the upload cap."""
    ceiling = policies.max_ceiling
    derived = (ceiling("code_bytes") + ceiling("stdin_bytes") * 4 // 3 + ceiling("input_total_bytes") * 4 // 3
               + ceiling("input_file_bytes") + _SLACK)  # fmt: skip
    return min(cap, derived)


class RouteBounds:
    """The byte bound of each route, from its declared body (resolved by matching the request the
    way the router will)."""

    def __init__(self, settings: ApiSettings, policies: PolicySet) -> None:
        self.json_bytes = settings.max_json_body_bytes
        self.upload_bytes = settings.max_body_bytes
        self.uploads = dict.fromkeys(UPLOADS, settings.max_body_bytes)
        self.uploads["/v1/executions"] = execution_bound(policies, settings.max_body_bytes)
        self._routes: list[tuple[Any, int]] | None = None

    def bound(self, scope: Scope) -> int:
        if scope.get("method") == "POST":
            upload = self.uploads.get(scope.get("path", "").rstrip("/"))
            if upload is not None:
                return upload
        if self._routes is None:
            self._routes = list(self._bounds(scope["app"].routes))
        for route, bound in self._routes:
            if route.matches(scope)[0] is Match.FULL:
                return bound
        return NO_BODY_BYTES  # answered 404 or 405: nothing to read

    def _bounds(self, routes: Iterable[Any]) -> Iterable[tuple[Any, int]]:
        for route in routes:
            inner = getattr(route, "original_router", None)
            if inner is not None:
                yield from self._bounds(inner.routes)
            elif isinstance(route, APIRoute):
                yield route, self._of(route)
            elif isinstance(route, Mount):
                yield route, self.json_bytes  # the MCP endpoint's JSON-RPC calls

    def _of(self, route: APIRoute) -> int:
        methods = route.methods or set()
        if any((m, route.path) in SMALL_ROUTES for m in methods):
            return SMALL_BODY_BYTES
        if route.body_field is not None or any((m, route.path) in READS_ITS_BODY for m in methods):
            return self.json_bytes
        return NO_BODY_BYTES


class BodyLimit:
    """Refuses a body above its route's bound (413) and one that arrives too slowly (408), both
    with Connection: close (the unread rest must not be taken for a next request)."""

    def __init__(self, app: ASGIApp, bounds: RouteBounds, settings: ApiSettings,
                 foreign: Mapping[str, ForeignShape]) -> None:  # fmt: skip
        self.app = app
        self.bounds = bounds
        self.foreign = foreign
        self.idle_s = settings.body_idle_timeout_s
        self.rate = settings.body_min_rate_bytes_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.bounds.bound(scope)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > cap:
            await self._refuse(scope, receive, send, 413, cap)
            return
        if length is None and b"transfer-encoding" not in headers:  # no body (a GET): nothing to bound or wait for
            await self.app(scope, receive, send)
            return
        expected = int(length) if length is not None and length.isdigit() else cap
        stream = scope.get("path", "") in STREAMS
        deadline = time.monotonic() + self.idle_s + expected / self.rate
        seen, done, started = 0, False, False

        async def counted() -> Message:
            nonlocal seen, done
            if done or stream:  # after the body: a wait for the client's disconnect, which has no deadline
                return await receive()
            wait = min(self.idle_s, deadline - time.monotonic())
            with anyio.move_on_after(max(wait, 0)) as late:
                message = await receive()
            if late.cancelled_caught:
                raise _TooSlow
            seen += len(message.get("body", b""))
            done = not message.get("more_body", False)
            if seen > cap:
                raise _TooLarge
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except (_TooLarge, _TooSlow) as exc:
            if started:
                raise
            await self._refuse(scope, receive, send, 413 if isinstance(exc, _TooLarge) else 408, cap)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, cap: int) -> None:
        if status == 413:
            hint = "; upload files with POST /v1/files and refer to them by id" if cap == self.bounds.json_bytes else ""
            hint = "; this route takes only a few short fields" if cap < self.bounds.json_bytes else hint
            code, detail = BodyTooLarge.code, BodyTooLarge(cap).message + hint
        else:
            code, detail = (
                _CODES[status],
                (
                    f"the request body did not arrive in time (each part within {self.idle_s:g} s, at least "
                    f"{self.rate // 1024} KiB/s overall); send it again on a new connection"
                ),
            )
        path = scope.get("path", "")
        shape = next((s for prefix, s in self.foreign.items() if path.startswith(prefix)), None)
        headers = {"Connection": "close"}
        if shape is not None:
            answer = shape(scope.get("method", ""), path, status, detail, headers)
        else:
            answer = problem_response(status, code, detail, False, headers=headers)
        await answer(scope, receive, send)


_CODES = {408: "request.timeout", 413: "request.too_large"}


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


def install(app: Any, settings: ApiSettings, policies: PolicySet, foreign: Mapping[str, ForeignShape]) -> RouteBounds:
    bounds = RouteBounds(settings, policies)
    app.add_middleware(BodyLimit, bounds=bounds, settings=settings, foreign=foreign)
    return bounds


__all__ = ["NO_BODY_BYTES", "SMALL_BODY_BYTES", "SMALL_ROUTES", "UPLOADS", "BodyLimit", "RouteBounds",
           "execution_bound", "install"]  # fmt: skip
