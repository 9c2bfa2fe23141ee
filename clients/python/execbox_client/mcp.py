"""execbox's tools for agents over the Model Context Protocol, written once for both ways of
serving them: the API's /mcp endpoint (Streamable HTTP, each call made in-process with the
caller's key) and `ebx mcp` (stdio, for desktop agents, each call made to a remote execbox with
the key in its configuration). Results carry stdout, stderr, the status, the error's category and
whether it is retryable; images a run shows come back as image content.

Needs the `mcp` extra (`pip install execbox-client[mcp]`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ContentBlock, ImageContent, TextContent

from execbox_client.client import AsyncClient
from execbox_client.errors import ExecboxError
from execbox_client.types import ExecutionPublic

MAX_TEXT = 64 << 10
"""Output a tool result quotes inline; the rest is in the execution (get it by id)."""
Connect = Callable[[Context[Any, Any, Any]], AsyncClient]
"""The client a tool call uses (it may depend on the call's request, e.g. its API key)."""


def _summary(execution: ExecutionPublic) -> dict[str, Any]:
    error = execution.get("error")
    return {
        "id": execution["id"], "status": execution["status"], "exit_code": execution.get("exit_code"),
        "stdout": (execution.get("stdout") or "")[:MAX_TEXT], "stderr": (execution.get("stderr") or "")[:MAX_TEXT],
        "outputs": execution.get("outputs") or {},
        "results": [r["data"]["text/plain"].get("text") for r in execution.get("results") or []
                    if "text/plain" in r["data"]],
        "error": {"category": error.get("category"), "message": error.get("message"),
                  "retryable": error.get("retryable")} if error else None,
        "artifacts": [{"name": a["name"], "size": a["size"], "media_type": a["media_type"]}
                      for a in execution.get("artifacts") or []],
    }  # fmt: skip


def _problem(exc: ExecboxError) -> dict[str, Any]:
    return {"refused": {"status": exc.status, "code": exc.code, "detail": exc.detail,
                        "errors": [{"field": e.field, "message": e.message} for e in exc.errors]}}  # fmt: skip


def build(server: FastMCP, connect: Connect) -> FastMCP:
    """Add execbox's tools to `server`; each call talks to execbox through `connect(ctx)`."""

    async def call(ctx: Context[Any, Any, Any], method: str, *args: Any, **kwargs: Any) -> Any:
        async with connect(ctx) as box:
            return await getattr(box, method)(*args, **kwargs)

    @server.tool()
    async def run_code(ctx: Context[Any, Any, Any], code: str, language: str = "python",
                       session: str | None = None, policy: dict[str, Any] | None = None,
                       files: list[dict[str, Any]] | None = None) -> list[ContentBlock]:  # fmt: skip
        """Run code in a fresh sandbox (or in `session`) and return its outcome: status, stdout,
        stderr, declared outputs, the error's category and whether retrying can help; charts the
        code shows come back as images. `files`: [{"path", "file_id" or "content_b64"}]."""
        fields: dict[str, Any] = {"policy": policy or {}, "files": files or []}
        if session:
            fields["session"] = session
        try:
            async with connect(ctx) as box:
                execution = await box.run(code, language, wait_s=600, **fields)
                pngs = [
                    r["data"]["image/png"]["url"] for r in execution.get("results") or [] if "image/png" in r["data"]
                ]
                images = [await box.download(url) for url in pngs]
        except ExecboxError as exc:
            return [TextContent(type="text", text=json.dumps(_problem(exc)))]
        blocks: list[ContentBlock] = [TextContent(type="text", text=json.dumps(_summary(execution)))]
        blocks += [ImageContent(type="image", data=base64.b64encode(png).decode(), mimeType="image/png")
                   for png in images]  # fmt: skip
        return blocks

    @server.tool()
    async def create_session(ctx: Context[Any, Any, Any], language: str = "python",
                             idle_timeout_s: int = 600) -> dict[str, Any]:  # fmt: skip
        """Open a session: a sandbox whose variables and files persist across run_code calls that name it."""
        created: dict[str, Any] = await call(ctx, "create_session", language, idle_timeout_s=idle_timeout_s)
        return {"id": created["id"], "status": created["status"], "expires_at": created.get("expires_at")}

    @server.tool()
    async def close_session(ctx: Context[Any, Any, Any], session_id: str) -> dict[str, Any]:
        """End a session now (its sandbox is removed)."""
        ended: dict[str, Any] = await call(ctx, "delete_session", session_id)
        return {"id": ended["id"], "status": ended["status"]}

    @server.tool()
    async def upload_file(ctx: Context[Any, Any, Any], name: str, content_b64: str) -> dict[str, Any]:
        """Store a file for later runs; pass {"path": ..., "file_id": <id>} in run_code's files."""
        stored: dict[str, Any] = await call(ctx, "upload_file", name, base64.b64decode(content_b64))
        return {"file_id": stored["id"], "size": stored["size"], "sha256": stored["sha256"]}

    @server.tool()
    async def fetch_artifact(ctx: Context[Any, Any, Any], execution_id: str, name: str) -> list[ContentBlock]:
        """An artifact a run left: an image as image content, text as text, anything else as base64."""
        data: bytes = await call(ctx, "artifact", execution_id, name)
        if name.lower().endswith(".png"):
            return [ImageContent(type="image", data=base64.b64encode(data).decode(), mimeType="image/png")]
        try:
            return [TextContent(type="text", text=data.decode("utf-8"))]
        except UnicodeDecodeError:
            return [TextContent(type="text", text=json.dumps({"base64": base64.b64encode(data).decode()}))]

    @server.tool()
    async def validate_plan(ctx: Context[Any, Any, Any], plan: dict[str, Any]) -> Any:
        """Check a plan (format plan/v1) without running it; refusals name each field at fault."""
        try:
            return await call(ctx, "validate_plan", plan)
        except ExecboxError as exc:
            return _problem(exc)

    @server.tool()
    async def run_plan(ctx: Context[Any, Any, Any], plan: dict[str, Any]) -> dict[str, Any]:
        """Run a plan until it ends or stops for an approval or a re-plan; a re-plan comes with its
        hand-off (what succeeded, what failed and why, what it invalidated)."""
        async with connect(ctx) as box:
            run = await box.start_run({"plan": plan})
            run = await box.get_run(run["id"], wait_s=60)
            handoff = await box.run_handoff(run["id"]) if run["status"] == "needs_replan" else None
        steps = {k: {"status": v["status"], "outputs": v.get("outputs")} for k, v in run["steps"].items()}
        return {"id": run["id"], "status": run["status"], "handoff": handoff, "steps": steps}

    @server.tool()
    async def search_scripts(ctx: Context[Any, Any, Any], query: str = "") -> Any:
        """Proven scripts in the library whose name, description or tags match."""
        return await call(ctx, "list_scripts", q=query or None)

    @server.tool()
    async def invoke_script(ctx: Context[Any, Any, Any], name: str, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run a library script (its newest proven version) with inputs; its outcome as run_code's."""
        async with connect(ctx) as box:
            started = await box.invoke_script(name, {"inputs": inputs})
            execution = await box.get_execution(started["id"], wait_s=60)
        return _summary(execution)

    return server
