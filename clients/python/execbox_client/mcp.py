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
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from mcp.server.fastmcp import Context
from mcp.types import ContentBlock, ImageContent, TextContent

from execbox_client.client import AsyncClient
from execbox_client.errors import ExecboxError
from execbox_client.types import ExecutionPublic

MAX_WAIT_S = 900.0
"""The longest a tool call follows a run (an agent calls get_run again to go on)."""
MAX_TEXT = 64 << 10
"""Output a tool result quotes inline; the rest is in the execution (get it by id)."""
Connect = Callable[[Context[Any, Any, Any]], AsyncClient]
"""The client a tool call uses (it may depend on the call's request, e.g. its API key)."""
ToolFunction = Callable[..., Any]
"""A tool as written: an async function whose signature is its input schema."""


class Registry(Protocol):
    """Where `build` adds the tools: a FastMCP server, or anything with its `tool()` decorator."""

    def tool(self) -> Callable[[ToolFunction], ToolFunction]: ...


R = TypeVar("R", bound=Registry)


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
        **{k: execution.get(k) for k in ("approval_id", "side_effects", "code_runs", "reconciled") if execution.get(k)},
    }  # fmt: skip


async def _until_ended(box: AsyncClient, execution: ExecutionPublic, wait_s: float = 600) -> ExecutionPublic:
    """The execution once it ends (or waits for an approval, or `wait_s` passes)."""
    deadline = time.monotonic() + wait_s
    while execution["status"] in ("queued", "running") and (left := deadline - time.monotonic()) > 0:
        execution = await box.get_execution(execution["id"], wait_s=min(left, 60))
    return execution


def _compensating(run: Any) -> bool:
    compensation = run.get("compensation")
    return compensation is not None and compensation["status"] == "running"


def _run_summary(run: dict[str, Any], events: list[dict[str, Any]], cursor: int) -> dict[str, Any]:
    shown = ("status", "outputs", "error", "side_effects", "approval_id", "key", "undo", "fallback_from")
    steps = {k: {key: v.get(key) for key in shown} for k, v in run["steps"].items()}
    for k, v in run["steps"].items():  # what an input step asks, with its context
        if v.get("status") == "awaiting_input":
            steps[k]["input"], steps[k]["context"] = v.get("input"), v.get("args")
    return {"id": run["id"], "status": run["status"], "stop_reason": run.get("stop_reason"),
            "revision": run["revision"], "steps": steps, "events": events, "cursor": cursor}  # fmt: skip


async def _follow(
    ctx: Context[Any, Any, Any], box: AsyncClient, run_id: str, wait_s: float, since: int
) -> dict[str, Any]:
    """The run once it stops running (or `wait_s` passes), a progress notification per event after
    `since` as each comes (the server answers a wait as soon as a new event exists), and the hand-off
    when it needs a re-plan."""
    deadline = time.monotonic() + min(max(wait_s, 0), MAX_WAIT_S)
    run: dict[str, Any] = dict(await box.get_run(run_id))
    cursor = min(max(since, 0), len(run["events"]))
    new: list[dict[str, Any]] = []
    while True:
        for event in run["events"][cursor:]:
            new.append(event)
            cursor += 1
            what = " ".join(str(event.get(k)) for k in ("type", "step", "status") if event.get(k))
            await ctx.report_progress(cursor, None, f"{what}: {event.get('detail', '')}"[:500])
        left = deadline - time.monotonic()
        if run["status"] != "running" or left <= 0:
            break
        run = dict(await box.get_run(run_id, wait_s=min(left, 60), after=cursor))
    summary = _run_summary(run, new, cursor)
    if run["status"] in ("needs_replan", "goal_failed"):
        summary["handoff"] = await box.run_handoff(run_id)
    return summary


def _problem(exc: ExecboxError) -> dict[str, Any]:
    return {"refused": {"status": exc.status, "code": exc.code, "detail": exc.detail,
                        "errors": [{"field": e.field, "message": e.message} for e in exc.errors]}}  # fmt: skip


def build(server: R, connect: Connect) -> R:
    """Add execbox's tools to `server`; each call talks to execbox through `connect(ctx)`."""

    async def call(ctx: Context[Any, Any, Any], method: str, *args: Any, **kwargs: Any) -> Any:
        async with connect(ctx) as box:
            return await getattr(box, method)(*args, **kwargs)

    @server.tool()
    async def run_code(ctx: Context[Any, Any, Any], code: str, language: str = "python",
                       session: str | None = None, policy: dict[str, Any] | None = None,
                       files: list[dict[str, Any]] | None = None, effect: str | None = None,
                       idempotency: dict[str, Any] | None = None, approval: dict[str, Any] | None = None,
                       idempotency_key: str | None = None) -> list[ContentBlock]:  # fmt: skip
        """Run code in a fresh sandbox (or in `session`) and return its outcome: status, stdout,
        stderr, declared outputs, the error's category and whether retrying can help; charts the
        code shows come back as images. `files`: [{"path", "file_id" or "content_b64"}].
        Side effects: `effect` "read" or "write"; a write's `idempotency` {"strategy": "key" (with
        "key"), "status_read" (with "status_check": {"code", "expect"}) or "none"}; `approval`
        {"summary"} returns at once `awaiting_approval` (decide_approval, then get_execution). An
        `unknown_outcome` is settled with reconcile_execution."""
        keyed = (idempotency or {}).get("strategy") == "key"
        if keyed and not (idempotency or {}).get("key") and not idempotency_key:
            # The client would make up a key per call: an agent's retry of this tool call would get another one.
            detail = "a keyed write needs a stable key: give idempotency.key (the same one when you call again)"
            refusal = {"status": 422, "code": "request.invalid", "detail": detail, "errors": []}
            return [TextContent(type="text", text=json.dumps({"refused": refusal}))]
        fields: dict[str, Any] = {"policy": policy or {}, "files": files or []}
        declared = {"session": session, "effect": effect, "idempotency": idempotency, "approval": approval}
        fields |= {name: value for name, value in declared.items() if value}
        try:
            async with connect(ctx) as box:
                if approval:  # nothing runs before the decision: answer now
                    execution = await box.submit(code, language, idempotency_key=idempotency_key, **fields)
                else:
                    execution = await box.submit(code, language, wait_s=60, idempotency_key=idempotency_key,
                                                 **fields)  # fmt: skip
                    execution = await _until_ended(box, execution)
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
    async def run_plan(ctx: Context[Any, Any, Any], plan: dict[str, Any], wait_s: float = 300) -> dict[str, Any]:
        """Run a plan until it ends or stops for an approval, an input or a re-plan (or `wait_s`
        passes), with a progress notification per event; a re-plan comes with its hand-off (what
        succeeded, what failed and why, what it invalidated). Go on with revise_run, supply_input,
        decide_approval, reconcile_step or get_run."""
        async with connect(ctx) as box:
            run = await box.start_run({"plan": plan})
            return await _follow(ctx, box, run["id"], wait_s, 0)

    @server.tool()
    async def get_run(ctx: Context[Any, Any, Any], run_id: str, wait_s: float = 60, since: int = 0) -> dict[str, Any]:
        """A run as it stands, once it stops running or `wait_s` passes, with the events after the
        cursor `since` (pass back the `cursor` it returns) and a progress notification per event."""
        async with connect(ctx) as box:
            return await _follow(ctx, box, run_id, wait_s, since)

    @server.tool()
    async def supply_input(ctx: Context[Any, Any, Any], run_id: str, step_id: str, value: dict[str, Any],
                           supplied_by: str = "", wait_s: float = 300) -> dict[str, Any]:  # fmt: skip
        """Give an input step (status awaiting_input: its `input` says what is asked and the schema,
        its `context` what earlier steps found) its value, then follow the run as run_plan does. A
        value the schema refuses is answered with each problem; the step keeps waiting."""
        async with connect(ctx) as box:
            try:
                seen = len((await box.get_run(run_id))["events"])  # only what follows the value is news
                await box.supply_input(run_id, step_id, value, supplied_by)
            except ExecboxError as exc:
                return _problem(exc)
            return await _follow(ctx, box, run_id, wait_s, seen)

    @server.tool()
    async def report_usage(ctx: Context[Any, Any, Any], run_id: str, role: str, input_tokens: int,
                           output_tokens: int, model: str = "", cost_usd: float = 0.0,
                           latency_ms: float | None = None, call_id: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Report one of your model calls for a run (role: planner, replanner, supplier, joiner, ...),
        so the run's cost is whole; a run past its token or cost budget stops."""
        body = {"role": role, "input_tokens": input_tokens, "output_tokens": output_tokens, "model": model,
                "cost_usd": cost_usd, "latency_ms": latency_ms, "call_id": call_id}  # fmt: skip
        try:
            run: dict[str, Any] = await call(ctx, "report_usage", run_id, body)
        except ExecboxError as exc:
            return _problem(exc)
        return {"status": run["status"], "stop_reason": run.get("stop_reason"), "usage": run.get("usage")}

    @server.tool()
    async def get_handoff(ctx: Context[Any, Any, Any], run_id: str) -> Any:
        """What a run that needs a re-plan hands back: done, failed and why, invalidated, remaining,
        unknown outcomes, budgets left, and how to revise."""
        return await call(ctx, "run_handoff", run_id)

    @server.tool()
    async def revise_run(ctx: Context[Any, Any, Any], run_id: str, base_revision: int,
                         add: list[dict[str, Any]] | None = None, remove: list[str] | None = None,
                         reason: str = "", goal: dict[str, Any] | None = None,
                         wait_s: float = 300) -> dict[str, Any]:  # fmt: skip
        """Revise a run against `base_revision` (new step ids; failed steps are superseded), then
        follow it as run_plan does."""
        body: dict[str, Any] = {"base_revision": base_revision, "reason": reason, "add": add or [],
                                "remove": remove or [], **({"goal": goal} if goal else {})}  # fmt: skip
        async with connect(ctx) as box:
            seen = len((await box.get_run(run_id))["events"])  # only what follows the revision is news
            try:
                await box.revise_run(run_id, body)
            except ExecboxError as exc:
                return _problem(exc)
            return await _follow(ctx, box, run_id, wait_s, seen)

    @server.tool()
    async def cancel_run(ctx: Context[Any, Any, Any], run_id: str, compensate: bool = False,
                         reason: str = "cancelled by the agent") -> dict[str, Any]:  # fmt: skip
        """Cancel a run: running steps are stopped, unfinished ones cancelled; with `compensate`, its
        succeeded writes are then undone in reverse order (follow it with get_run)."""
        try:
            run: dict[str, Any] = await call(ctx, "cancel_run", run_id, compensate=compensate, reason=reason)
        except ExecboxError as exc:
            return _problem(exc)
        return _run_summary(run, [], len(run.get("events") or []))

    @server.tool()
    async def compensate_run(
        ctx: Context[Any, Any, Any], run_id: str, reason: str, wait_s: float = 300
    ) -> dict[str, Any]:
        """Undo a run's succeeded writes, each with its declared compensation, in reverse dependency
        order (an unfinished run is abandoned first); follows it until it ends or `wait_s` passes. A
        compensation that fails stops it (the step says why); asking again resumes there."""
        async with connect(ctx) as box:
            try:
                run = await box.compensate_run(run_id, reason)
            except ExecboxError as exc:
                return _problem(exc)
            deadline = time.monotonic() + min(max(wait_s, 0), MAX_WAIT_S)
            while _compensating(run) and (left := deadline - time.monotonic()) > 0:
                run = await box.get_run(run_id, wait_s=min(left, 60), after=len(run["events"]))
        summary = _run_summary(dict(run), [], len(run["events"]))
        summary["compensation"] = run.get("compensation")
        return summary

    @server.tool()
    async def list_approvals(ctx: Context[Any, Any, Any], status: str = "pending") -> dict[str, Any]:
        """Approvals of plan steps and of executions (status: pending, approved, rejected, expired, withdrawn),
        each with everything that runs because of it: code, args (or non-object inputs), env names with value
        digests, stdin and files' digests, network, and the checks and compensation that run with it."""
        found: list[dict[str, Any]] = await call(ctx, "list_approvals", status=status or None)
        keep = ("id", "status", "summary", "run_id", "step_id", "execution_id", "args", "inputs", "code", "language",
                "env_sha256", "stdin_bytes", "stdin_sha256", "files", "network", "policy", "also_runs", "required_by",
                "reason", "expires_at")  # fmt: skip
        return {"approvals": [{k: a.get(k) for k in keep} for a in found]}

    @server.tool()
    async def decide_approval(ctx: Context[Any, Any, Any], approval_id: str, decision: str, reason: str = "",
                              decided_by: str = "") -> dict[str, Any]:  # fmt: skip
        """Approve or reject (`decision`: approve | reject) a pending approval."""
        body = {"decision": decision, "reason": reason, "decided_by": decided_by}
        try:
            decided: dict[str, Any] = await call(ctx, "decide_approval", approval_id, body)
        except ExecboxError as exc:
            return _problem(exc)
        return {k: decided.get(k) for k in ("id", "status", "run_id", "step_id", "execution_id", "decided_by")}

    @server.tool()
    async def reconcile_step(ctx: Context[Any, Any, Any], run_id: str, step_id: str, outcome: str, reason: str,
                             outputs: dict[str, Any] | None = None, retry: bool = False) -> dict[str, Any]:  # fmt: skip
        """Settle a step's unknown outcome from evidence: `outcome` applied | not_applied (with `retry`,
        run it again with the same idempotency key)."""
        body = {"outcome": outcome, "reason": reason, "outputs": outputs or {}, "retry": retry}
        try:
            run: dict[str, Any] = await call(ctx, "reconcile_step", run_id, step_id, body)
        except ExecboxError as exc:
            return _problem(exc)
        return _run_summary(run, [], len(run.get("events") or []))

    @server.tool()
    async def get_execution(ctx: Context[Any, Any, Any], execution_id: str, wait_s: float = 60) -> dict[str, Any]:
        """An execution as run_code reports it, once it ends or `wait_s` passes (e.g. after its approval)."""
        return _summary(await call(ctx, "get_execution", execution_id, wait_s=min(wait_s, 60) or None))

    @server.tool()
    async def reconcile_execution(ctx: Context[Any, Any, Any], execution_id: str, outcome: str, reason: str,
                                  outputs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """Settle an execution's unknown outcome: `outcome` applied (succeeded, with `outputs`) or
        not_applied (failed; run it again with the same key if it should happen)."""
        body = {"outcome": outcome, "reason": reason, "outputs": outputs or {}}
        try:
            return _summary(await call(ctx, "reconcile_execution", execution_id, body))
        except ExecboxError as exc:
            return _problem(exc)

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
