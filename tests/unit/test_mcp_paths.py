"""Issue 44 (low): MCP tools put the ids they were given into URL paths unchecked, so an id with `/` or
a dot segment reached another route than the tool's (`cancel_run` cancelled an execution). The client
sends every path parameter as exactly one segment and refuses what cannot be one, naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from execbox_client import Client, InvalidRequest

from execbox.api import create_app
from execbox.core.redis import connect
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.conftest import Redis
from tests.unit.conftest import InProcess, make_record

pytestmark = pytest.mark.redis


def tool(http: InProcess, headers: dict[str, str], name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    sent = {**headers, "Accept": "application/json, text/event-stream", "Host": "localhost:8000"}
    answer = http.post("/mcp/", json=call, headers=sent)
    assert answer.status_code == 200, answer.text
    (data,) = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: ")]
    result: dict[str, Any] = json.loads(data)["result"]
    return result


def test_a_run_id_that_walks_to_an_execution_does_not_cancel_it(
    api: tuple[InProcess, dict[str, dict[str, str]]], settings: Settings, client: redis.Redis
) -> None:
    http, headers = api
    store = ExecutionStore(client, settings)
    record = make_record(settings)
    store.create(record)

    result = tool(http, headers["alpha"], "cancel_run", {"run_id": f"../executions/{record.id}"})

    refused = json.loads(result["content"][0]["text"])["refused"]
    assert refused["status"] == 422 and refused["errors"][0]["field"] == "path.run_id", refused
    stored = store.get(record.id)
    assert stored is not None and stored.status is ExecutionStatus.QUEUED, "the execution was cancelled"


@pytest.mark.parametrize(
    "approval_id", ["apr_x/../../../v1/approvals", "..", ".", "", "apr_x?status=pending", "apr_x#y", "a\r\nb"]
)
def test_an_approval_id_that_is_not_one_segment_is_refused_naming_it(
    api: tuple[InProcess, dict[str, dict[str, str]]], approval_id: str
) -> None:
    http, headers = api

    result = tool(http, headers["alpha"], "decide_approval", {"approval_id": approval_id, "decision": "approve"})

    text = result["content"][0]["text"]
    assert "path.approval_id" in text, text


def test_a_path_parameter_is_sent_as_one_quoted_segment() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={"id": "x"})

    with Client("http://execbox.test", "k", transport=httpx.MockTransport(record), max_retries=0) as box:
        box.get_script_version("tool%2F..", "1.0.0")
        box.artifact("exe_x", "out dir/a#b.txt")
        with pytest.raises(InvalidRequest) as refused:
            box.artifact("exe_x", "out/../../../v1/approvals")

    assert seen == ["/v1/scripts/tool%252F../versions/1.0.0", "/v1/executions/exe_x/artifacts/out%20dir/a%23b.txt"]
    assert refused.value.errors[0].field == "path.name"


def test_each_apps_tool_calls_reach_that_app_though_the_tools_are_made_once(
    api: tuple[InProcess, dict[str, dict[str, str]]],
    settings: Settings,
    client: redis.Redis,
    redis_server: Redis,
    tmp_path: Path,
) -> None:
    """The tools are built once per process and shared by every app's /mcp (their schemas are costly
    to build); the app a call runs against is the one its request reached, never another's."""
    http, headers = api
    record = make_record(settings)
    ExecutionStore(client, settings).create(record)
    other = Settings(redis={"url": redis_server.url, "key_prefix": "umcp2"}, queue={"name": "umcp2"},
                     artifacts_dir=tmp_path / "other")  # fmt: skip
    with connect(other) as other_redis:
        other_key = ApiKeys(other_redis, "umcp2").create("alpha")[0]
        second = InProcess(create_app(other))
        try:
            own = tool(http, headers["alpha"], "get_execution", {"execution_id": record.id, "wait_s": 0})
            assert json.loads(own["content"][0]["text"])["id"] == record.id, own
            elsewhere = tool(second, {"Authorization": f"Bearer {other_key}"}, "get_execution",
                             {"execution_id": record.id, "wait_s": 0})  # fmt: skip
            assert elsewhere["isError"] and "404" in elsewhere["content"][0]["text"], elsewhere
        finally:
            second.close()
            for key in other_redis.scan_iter(match="umcp2:*"):
                other_redis.delete(key)
