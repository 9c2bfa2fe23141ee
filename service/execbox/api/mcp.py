"""The Model Context Protocol endpoint: execbox's tools (execbox_client.mcp) over Streamable HTTP,
mounted on the API at /mcp behind the same API keys.

Each tool call is a call of the REST API made in this process (an ASGI transport to this same app,
no socket) with the caller's own key: every check, quota, limit and tenant boundary is the API's
own, written once. A request without a key the API knows is refused (401) before the protocol
starts.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
from execbox_client import AsyncClient, ExecboxError
from execbox_client.mcp import build
from fastapi import FastAPI
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.fastmcp.tools import Tool
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)
INTERNAL_URL = "http://execbox.internal"
API_SCOPE_KEY = "execbox.api"
"""Where a request to /mcp carries the API it reached, for the tools its call runs."""


def _bearer(value: str) -> str | None:
    return value.removeprefix("Bearer ").strip() or None


class _KeyRequired:
    """401 for a request whose API key the service does not know, before the protocol begins."""

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            async with _client(self.api, _bearer(headers.get("authorization", ""))) as box:
                try:
                    await box.languages()  # the API's own authentication
                except ExecboxError as exc:
                    body = json.dumps({"status": exc.status, "code": exc.code, "detail": exc.detail}).encode()
                    await send({"type": "http.response.start", "status": exc.status,
                                "headers": [(b"content-type", b"application/problem+json")]})  # fmt: skip
                    await send({"type": "http.response.body", "body": body})
                    return
            scope = {**scope, API_SCOPE_KEY: self.api}
        await self.app(scope, receive, send)


def _client(api: FastAPI, key: str | None) -> AsyncClient:
    return AsyncClient(INTERNAL_URL, key, transport=httpx.ASGITransport(app=api), max_retries=0)


class _Tools:
    """execbox's tools as FastMCP `Tool`s, each guarded: a failure tells the caller what the API said,
    never the service's own exception text (an API refusal, ExecboxError, is the API's problem
    detail; anything else a generic message with an id the operator finds in the log)."""

    def __init__(self) -> None:
        self.made: list[Tool] = []

    def tool(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.made.append(Tool.from_function(_guarded(fn)))
            return fn

        return add


def _guarded(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ExecboxError as exc:
            raise ToolError(f"{exc.status} {exc.code}: {exc.detail}") from exc
        except Exception as exc:
            trace = secrets.token_hex(16)
            log.exception("MCP tool %s failed (trace %s)", fn.__name__, trace)
            raise ToolError(f"the tool failed; check its arguments, or quote trace {trace} to the operator") from exc

    return call


def _connect(ctx: Context[Any, Any, Any]) -> AsyncClient:
    """The API in this process (which `_KeyRequired` puts in the request's scope), with the caller's key."""
    request = ctx.request_context.request
    if request is None:
        raise RuntimeError("an MCP tool call came without its HTTP request")
    return _client(request.scope[API_SCOPE_KEY], _bearer(request.headers.get("authorization", "")))


@functools.cache
def _tools() -> tuple[Tool, ...]:
    """Made once per process and shared by every app's server: a tool's schema is a pydantic model
    built from its signature (~10 ms each, 21 tools), and the tools hold no app of their own."""
    return tuple(build(_Tools(), _connect).made)


def mount(api: FastAPI) -> AbstractAsyncContextManager[None]:
    """Add /mcp to the API; the returned context runs the protocol's session manager (the API's
    lifespan enters it)."""
    # Answers as event streams (not one JSON body), so a long tool call can send progress notifications.
    server = FastMCP[Any]("execbox", tools=list(_tools()), stateless_http=True, json_response=False,
                          streamable_http_path="/")  # fmt: skip
    api.mount("/mcp", _KeyRequired(server.streamable_http_app(), api))
    return server.session_manager.run()
