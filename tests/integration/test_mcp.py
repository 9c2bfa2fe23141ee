"""The MCP endpoint (/mcp, Streamable HTTP) with the SDK's own ClientSession against the live
service: the tools are listed, code runs, a chart comes back as an image, a session keeps state,
and a caller without a key is refused."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import ImageContent, TextContent

from tests.conftest import ROOT, Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('drawn')\n"


def with_session(stack: Stack, body: Callable[[ClientSession], Awaitable[Any]], key: str | None = None) -> Any:
    async def scenario() -> Any:
        headers = {"Authorization": f"Bearer {key or stack.keys['alpha']}"}
        async with (
            create_mcp_http_client(headers, httpx.Timeout(120.0)) as http,
            streamable_http_client(f"{stack.base_url}/mcp/", http_client=http) as (read, write, _),
        ):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)

    return asyncio.run(scenario())


def summary(result: Any) -> dict[str, Any]:
    (text,) = [c for c in result.content if isinstance(c, TextContent)]
    found: dict[str, Any] = json.loads(text.text)
    return found


def test_the_tools_are_listed_and_code_runs(stack: Stack) -> None:
    async def body(session: ClientSession) -> tuple[set[str], Any, Any]:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        ran = await session.call_tool("run_code", {"code": "print(6 * 7)"})
        failed = await session.call_tool("run_code", {"code": "import time\ntime.sleep(5)", "policy": {"timeout_s": 1}})
        return tools, ran, failed

    tools, ran, failed = with_session(stack, body)
    assert {"run_code", "create_session", "close_session", "upload_file", "fetch_artifact", "validate_plan",
            "run_plan", "search_scripts", "invoke_script"} <= tools  # fmt: skip
    assert summary(ran)["stdout"] == "42\n" and summary(ran)["status"] == "succeeded"
    assert summary(failed)["error"] == {"category": "limit.timeout", "message": summary(failed)["error"]["message"],
                                        "retryable": False}  # fmt: skip


def test_a_chart_comes_back_as_an_image_and_a_session_keeps_state(stack: Stack) -> None:
    async def body(session: ClientSession) -> tuple[Any, Any]:
        drawn = await session.call_tool("run_code", {"code": PLOT})
        opened = json.loads((await session.call_tool("create_session", {})).content[0].text)  # type: ignore[union-attr]
        await session.call_tool("run_code", {"code": "x = 41", "session": opened["id"]})
        answer = await session.call_tool("run_code", {"code": "print(x + 1)", "session": opened["id"]})
        await session.call_tool("close_session", {"session_id": opened["id"]})
        return drawn, answer

    drawn, answer = with_session(stack, body)
    images = [c for c in drawn.content if isinstance(c, ImageContent)]
    assert summary(drawn)["stdout"] == "drawn\n" and len(images) == 1 and images[0].mimeType == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
    assert summary(answer)["stdout"] == "42\n"


def test_a_caller_without_a_known_key_is_refused(stack: Stack) -> None:
    for headers in ({}, {"Authorization": "Bearer ebx_nobody_0000"}):
        accept = {"Accept": "application/json, text/event-stream"}
        answer = httpx.post(f"{stack.base_url}/mcp/", headers={**headers, **accept},
                            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)  # fmt: skip
        assert answer.status_code == 401, answer.text


def test_ebx_mcp_forwards_stdio_to_the_service(stack: Stack) -> None:
    server = StdioServerParameters(command=str(ROOT / ".venv" / "bin" / "ebx"), args=["mcp", "--stdio"],
                                   env={"EXECBOX_URL": stack.base_url, "EXECBOX_API_KEY": stack.keys["alpha"],
                                        "EXECBOX_CONFIG": "/nonexistent", "PATH": os.environ["PATH"]})  # fmt: skip

    async def scenario() -> tuple[set[str], Any]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            return tools, await session.call_tool("run_code", {"code": "print(6 * 7)"})

    tools, ran = asyncio.run(scenario())
    assert "run_code" in tools and summary(ran)["stdout"] == "42\n"


def tool_json(result: Any) -> Any:
    assert not result.isError, result.content
    (text,) = [c for c in result.content if isinstance(c, TextContent)]
    return json.loads(text.text)


FAILS = "import execbox\nexecbox.check(False, 'the total is off by one')"
FIXED = "import execbox\nexecbox.emit('total', 42)"


def test_an_mcp_only_agent_revises_a_plan_from_needs_replan_to_succeeded(stack: Stack) -> None:
    plan = {"format": "plan/v1", "steps": [{"id": "total", "run": {"code": FAILS}}]}
    notes: list[str] = []

    async def body(session: ClientSession) -> tuple[Any, Any, Any]:
        async def heard(progress: float, total: float | None, message: str | None) -> None:
            notes.append(message or "")

        stopped = tool_json(await session.call_tool("run_plan", {"plan": plan}, progress_callback=heard))
        handoff = tool_json(await session.call_tool("get_handoff", {"run_id": stopped["id"]}))
        fix = {"id": "total2", "run": {"code": FIXED}}
        revision = {"run_id": stopped["id"], "base_revision": stopped["revision"], "add": [fix], "reason": "fixed"}
        revised = tool_json(await session.call_tool("revise_run", revision))
        return stopped, handoff, revised

    stopped, handoff, revised = with_session(stack, body)
    assert stopped["status"] == "needs_replan" and stopped["handoff"]["failed"][0]["step_id"] == "total"
    assert handoff["failed"][0]["error"]["category"] == "check.failed"
    assert any("step.status_changed total failed" in m for m in notes), notes
    assert revised["status"] == "succeeded" and revised["steps"]["total2"]["outputs"] == {"total": 42}
    assert revised["steps"]["total"]["status"] == "superseded"


def test_an_mcp_only_agent_decides_an_approval(stack: Stack) -> None:
    gated = {"id": "send", "run": {"code": FIXED}, "approval": {"summary": "send the total"}}
    plan = {"format": "plan/v1", "steps": [gated]}

    async def body(session: ClientSession) -> tuple[Any, Any, Any, Any]:
        waiting = tool_json(await session.call_tool("run_plan", {"plan": plan}))
        pending = tool_json(await session.call_tool("list_approvals", {"status": "pending"}))["approvals"]
        (mine,) = [a for a in pending if a["run_id"] == waiting["id"]]
        decided = tool_json(
            await session.call_tool("decide_approval", {"approval_id": mine["id"], "decision": "approve"})
        )
        done = tool_json(await session.call_tool("get_run", {"run_id": waiting["id"], "since": waiting["cursor"]}))
        return waiting, mine, decided, done

    waiting, approval, decided, done = with_session(stack, body)
    assert waiting["status"] == "awaiting_approval" and approval["summary"] == "send the total"
    assert decided["status"] == "approved"
    assert done["status"] == "succeeded" and done["steps"]["send"]["outputs"] == {"total": 42}
    assert done["events"] and all(e["type"] != "run.created" for e in done["events"]), "only events after the cursor"


def test_an_mcp_only_agent_supplies_an_input_step_and_reports_its_calls(stack: Stack) -> None:
    asked = {"id": "n", "input": {"summary": "pick a number", "schema": {
        "type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "minimum": 1}}}},
        "args": {"total": {"$ref": "/steps/total/outputs/total"}}}  # fmt: skip
    double = {"id": "double", "run": {"code": "import execbox\nexecbox.emit('x', execbox.inputs['n'] * 2)\n"},
              "args": {"n": {"$ref": "/steps/n/outputs/n"}}}  # fmt: skip
    plan = {"format": "plan/v1", "steps": [{"id": "total", "run": {"code": FIXED}}, asked, double]}

    async def body(session: ClientSession) -> tuple[Any, Any, Any, Any]:
        waiting = tool_json(await session.call_tool("run_plan", {"plan": plan}))
        supply = {"run_id": waiting["id"], "step_id": "n", "supplied_by": "the agent"}
        refused = tool_json(await session.call_tool("supply_input", {**supply, "value": {"n": 0}}))
        done = tool_json(await session.call_tool("supply_input", {**supply, "value": {"n": 21}}))
        usage = tool_json(await session.call_tool("report_usage", {
            "run_id": waiting["id"], "role": "supplier", "input_tokens": 120, "output_tokens": 8}))  # fmt: skip
        return waiting, refused, done, usage

    waiting, refused, done, usage = with_session(stack, body)
    assert waiting["status"] == "awaiting_input" and waiting["steps"]["n"]["context"] == {"total": 42}
    assert waiting["steps"]["n"]["input"]["summary"] == "pick a number"
    assert refused["refused"]["code"] == "input.invalid" and refused["refused"]["errors"][0]["field"] == "value.n"
    assert done["status"] == "succeeded" and done["steps"]["double"]["outputs"] == {"x": 42}
    assert usage["usage"]["by_role"]["supplier"]["input_tokens"] == 120


UNSURE = "import execbox\nexecbox.outcome_unknown('the mail server hung up after DATA')"


def test_an_mcp_only_agent_reconciles_unknown_outcomes(stack: Stack) -> None:
    write = {"effect": "write", "idempotency": {"strategy": "none"}}
    plan = {"format": "plan/v1", "steps": [{"id": "mail", "run": {"code": UNSURE}, **write}]}

    async def body(session: ClientSession) -> tuple[Any, Any, Any, Any]:
        ran = summary(await session.call_tool("run_code", {"code": UNSURE, **write}))
        settled = tool_json(await session.call_tool("reconcile_execution", {
            "execution_id": ran["id"], "outcome": "applied", "reason": "the mail is in the sent folder"}))  # fmt: skip
        stopped = tool_json(await session.call_tool("run_plan", {"plan": plan}))
        evidence = {"run_id": stopped["id"], "step_id": "mail", "outcome": "applied", "reason": "it went out"}
        step = tool_json(await session.call_tool("reconcile_step", evidence))
        return ran, settled, stopped, step

    ran, settled, stopped, step = with_session(stack, body)
    assert ran["status"] == "unknown_outcome" and ran["error"]["category"] == "outcome.unknown"
    assert settled["status"] == "succeeded"
    assert stopped["status"] == "needs_replan" and stopped["steps"]["mail"]["status"] == "unknown_outcome"
    assert step["status"] == "succeeded" and step["steps"]["mail"]["status"] == "succeeded"


def test_run_code_declares_effects_and_an_approval_waits(stack: Stack) -> None:
    async def body(session: ClientSession) -> tuple[Any, Any, Any]:
        keyed = {"effect": "write", "idempotency": {"strategy": "key", "key": "mcp-k-1"}}
        key = summary(await session.call_tool("run_code", {"code": "import execbox\nprint(execbox.idempotency_key())",
                                                           **keyed}))  # fmt: skip
        waiting = summary(await session.call_tool("run_code", {"code": "print(1)", "approval": {"summary": "ok?"}}))
        (mine,) = [a for a in tool_json(await session.call_tool("list_approvals", {}))["approvals"]
                   if a["execution_id"] == waiting["id"]]  # fmt: skip
        await session.call_tool("decide_approval", {"approval_id": mine["id"], "decision": "reject", "reason": "no"})
        rejected = tool_json(await session.call_tool("get_execution", {"execution_id": waiting["id"]}))
        return key, waiting, rejected

    key, waiting, rejected = with_session(stack, body)
    assert key["stdout"] == "mcp-k-1\n"
    assert waiting["status"] == "awaiting_approval"
    assert rejected["status"] == "failed" and rejected["error"]["category"] == "approval.rejected"
