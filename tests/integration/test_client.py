"""The Python client (clients/python) against the live service: runs, refusals as typed errors,
safe retries, live events with resumption, files, sessions, the async client."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from execbox_client import AsyncClient, Client, ExecutionPublic, InvalidRequest, NotFound, Unauthorized

from tests.conftest import Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def client(stack: Stack, **options: Any) -> Client:
    return Client(stack.base_url, stack.keys["alpha"], **options)


def test_run_waits_for_the_end_and_joins_the_callers_trace(stack: Stack) -> None:
    with client(stack, traceparent=f"00-{TRACE}-00f067aa0ba902b7-01") as box:
        done = box.run("import time\ntime.sleep(1)\nprint(6 * 7)", wait_s=30)
    assert (done["status"], done["stdout"], done["trace_id"]) == ("succeeded", "42\n", TRACE)


def test_refusals_are_typed_errors_that_name_the_field(stack: Stack) -> None:
    with client(stack) as box:
        with pytest.raises(InvalidRequest) as refused:
            box.submit("print(1)", policy={"memory_mb": 1 << 19})
        assert refused.value.status == 422 and "policy.memory_mb" in [e.field for e in refused.value.errors]
        with pytest.raises(NotFound):
            box.get_execution("exe_" + "a" * 26)
    with Client(stack.base_url, "ebx_nobody_0000") as stranger, pytest.raises(Unauthorized):
        stranger.languages()


class LosesFirstAnswer(httpx.BaseTransport):
    """In front of the real service: the first POST reaches it and is processed, but its answer is
    replaced by a 503 with Retry-After, as a proxy losing the response would."""

    def __init__(self) -> None:
        self.real = httpx.HTTPTransport()
        self.posts: list[tuple[str | None, str | None]] = []
        """(Idempotency-Key sent, Idempotent-Replayed answered) per POST that reached the service."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.real.handle_request(request)
        if request.method != "POST":
            return response
        self.posts.append((request.headers.get("Idempotency-Key"), response.headers.get("Idempotent-Replayed")))
        if len(self.posts) > 1:
            return response
        response.read()
        return httpx.Response(503, headers={"Retry-After": "0.1"}, json={"code": "service.unavailable"})

    def close(self) -> None:
        self.real.close()


def test_a_lost_answer_is_retried_with_the_same_key_and_runs_once(stack: Stack) -> None:
    transport = LosesFirstAnswer()
    with client(stack, transport=transport) as box:
        done = box.run("print('once')", wait_s=30)
    assert done["status"] == "succeeded" and done["stdout"] == "once\n"
    (first_key, first_replayed), (second_key, second_replayed) = transport.posts
    assert first_key and second_key == first_key, "the retry carries the first attempt's key"
    assert (first_replayed, second_replayed) == (None, "true"), "the service answered the retry with the first run"


def test_events_stream_output_before_the_end_and_resume_without_repeats(stack: Stack) -> None:
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\n"
    with client(stack) as box:
        execution = box.submit(code)
        events, status_at_first_output = [], None
        for event in box.events(execution["id"]):
            events.append(event)
            if event.event == "stdout" and status_at_first_output is None:
                status_at_first_output = box.get_execution(execution["id"])["status"]
        resumed = list(box.events(execution["id"], last_event_id=events[0].id))
    assert status_at_first_output == "running", "output arrives while the program still runs"
    kinds = [e.event for e in events]
    assert kinds[-1] == "end" and events[-1].data["status"] == "succeeded" and kinds.count("end") == 1
    assert "".join(e.data["text"] for e in events if e.event == "stdout") == "0\n1\n2\n"
    assert kinds.index("stdout") < kinds.index("end")
    assert [e.id for e in resumed] == [e.id for e in events[1:]], "resumed after the first, nothing twice"


def test_files_and_sessions_through_the_client(stack: Stack) -> None:
    with client(stack) as box:
        uploaded = box.upload_file("data.csv", b"a,b\n1,2\n")
        assert box.get_file(uploaded["id"])["size"] == 8
        read = box.run("print(open('data.csv').read().splitlines()[1])",
                       files=[{"file_id": uploaded["id"], "path": "data.csv"}])  # fmt: skip
        assert read["stdout"] == "1,2\n", read
        session = box.create_session("python")
        try:
            box.run("x = 41", session=session["id"])
            answer = box.run("x + 1", session=session["id"])
            assert answer["results"][0]["data"]["text/plain"]["text"] == "42"
            assert session["id"] in [s["id"] for s in box.list_sessions()["sessions"]]
        finally:
            assert box.delete_session(session["id"])["status"] == "ended"
        assert any(lang["name"] == "python" for lang in box.languages()["languages"])
        assert box.language("python")["name"] == "python"


def test_artifacts_results_records_and_cancel_through_the_client(stack: Stack) -> None:
    code = ("open('out/a.txt', 'w').write('kept')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2])\nplt.show()\n")  # fmt: skip
    with client(stack) as box:
        done = box.run(code, wait_s=60, policy={"timeout_s": 40})
        assert done["status"] == "succeeded", done
        assert box.artifact(done["id"], "a.txt") == b"kept"
        assert box.download(done["artifacts"][0]["url"]) == b"kept"
        png = done["results"][0]["data"]["image/png"]
        assert box.result_file(done["id"], png["url"].rsplit("/", 1)[1]).startswith(b"\x89PNG")
        record = box.get_execution_record(done["id"])
        assert record["status"] == "succeeded" and record["image"] and record["transitions"], record
        slow = box.submit("import time\ntime.sleep(30)")
        assert box.cancel_execution(slow["id"])["id"] == slow["id"]
        assert box.get_execution(slow["id"], wait_s=30)["status"] == "cancelled"
        session = box.create_session("python")
        try:
            assert box.get_session(session["id"])["id"] == session["id"]
        finally:
            box.delete_session(session["id"])


def test_the_async_client_runs_and_streams(stack: Stack) -> None:
    async def scenario() -> tuple[ExecutionPublic, list[str]]:
        async with AsyncClient(stack.base_url, stack.keys["alpha"]) as box:
            done = await box.run("print('async')", wait_s=30)
            kinds = [event.event async for event in box.events(done["id"])]
            return done, kinds

    done, kinds = asyncio.run(scenario())
    assert done["stdout"] == "async\n" and kinds[-1] == "end" and "stdout" in kinds


def test_the_client_is_a_light_install() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("<")[0].split("=")[0].strip() for dep in project["dependencies"]}
    assert names == {"httpx", "httpx-sse", "click"}
    probe = "import sys, execbox_client; print(any(m == 'execbox' or m.startswith('execbox.') for m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "False", "importing the client loads nothing of the server"


def test_plans_runs_and_approvals_through_the_client(stack: Stack) -> None:
    gated = {"id": "send", "run": {"code": "import execbox\nexecbox.emit('sent', execbox.inputs['to'])\n"},
             "args": {"to": {"$ref": "/inputs/to"}}, "effect": "write", "idempotency": {"strategy": "key"},
             "approval": {"summary": "send the report"}}  # fmt: skip
    plan = {"format": "plan/v1", "inputs": {"to": "ops@example.com"}, "steps": [gated]}
    with client(stack) as box:
        assert box.validate_plan(plan)["valid"] is True
        waiting = box.get_run(box.start_run({"plan": plan})["id"], wait_s=60)
        assert waiting["status"] == "awaiting_approval"
        approval_id = waiting["steps"]["send"]["approval_id"]
        assert approval_id in [a["id"] for a in box.list_approvals()]
        assert box.get_approval(approval_id)["args"] == {"to": "ops@example.com"}
        box.decide_approval(approval_id, {"decision": "approve", "decided_by": "alice"})
        done = box.get_run(waiting["id"], wait_s=60)
        assert done["status"] == "succeeded" and done["steps"]["send"]["outputs"] == {"sent": "ops@example.com"}
        assert waiting["id"] in [r["id"] for r in box.list_runs()]

        failing = {"format": "plan/v1", "steps": [{"id": "a", "run": {"code": "raise SystemExit(3)"}}]}
        stopped = box.get_run(box.start_run({"plan": failing})["id"], wait_s=60)
        assert stopped["status"] == "needs_replan"
        assert [s["step_id"] for s in box.run_handoff(stopped["id"])["failed"]] == ["a"]
        revision = {"base_revision": stopped["revision"], "reason": "fixed", "remove": ["a"],
                    "add": [{"id": "b", "run": {"code": "print('b')"}}]}  # fmt: skip
        assert box.revise_run(stopped["id"], revision)["revision"] == stopped["revision"] + 1
        assert box.get_run(stopped["id"], wait_s=60)["status"] == "succeeded"
        with pytest.raises(InvalidRequest):  # nothing to reconcile: the route answers with the field at fault
            box.reconcile_step(stopped["id"], "b", {"outcome": "maybe"})
        usage = {"model": "scripted", "role": "replanner", "input_tokens": 120, "output_tokens": 40}
        assert box.report_usage(stopped["id"], usage)["id"] == stopped["id"]
        slow = box.start_run({"plan": {"format": "plan/v1", "steps": [
            {"id": "s", "run": {"code": "import time\ntime.sleep(30)"}}]}})  # fmt: skip
        assert box.cancel_run(slow["id"])["status"] in ("cancelling", "cancelled")


def test_scripts_schedules_and_events_through_the_client(stack: Stack) -> None:
    name = f"client.count_{secrets.token_hex(3)}"
    code = "import execbox\nexecbox.emit('n', len(execbox.inputs['items']))\n"
    schema = {"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}}
    with client(stack) as box:
        box.register_script({"name": name, "version": "1.0.0", "code": code, "description": "counts items",
                             "tags": ["client"], "input_schema": schema})  # fmt: skip
        assert name in [s["name"] for s in box.list_scripts(q="counts")]
        assert [v["version"] for v in box.get_script(name)["versions"]] == ["1.0.0"]
        assert box.get_script_version(name, "1.0.0")["code"] == code
        invoked = box.invoke_script(name, {"version": "1.0.0", "inputs": {"items": [1, 2, 3]}})
        ran = box.get_execution(invoked["id"], wait_s=60)
        assert ran["status"] == "succeeded" and ran["outputs"] == {"n": 3}, ran
        promoted = box.promote_script(name, "1.0.0", {"status": "proven", "evidence": [ran["id"]]})
        assert promoted["status"] == "proven"

        schedule = box.create_schedule({"script": f"{name}@1.0.0", "cron": "0 3 * * *", "inputs": {"items": []}})
        assert box.get_schedule(schedule["id"])["cron"] == "0 3 * * *"
        assert schedule["id"] in [s["id"] for s in box.list_schedules()]
        assert box.update_schedule(schedule["id"], {"inputs": {"items": [1]}})["inputs"] == {"items": [1]}
        assert box.pause_schedule(schedule["id"])["paused"] is True
        assert box.resume_schedule(schedule["id"])["paused"] is False
        assert box.schedule_firings(schedule["id"]) == []
        box.delete_schedule(schedule["id"])
        with pytest.raises(NotFound):
            box.get_schedule(schedule["id"])
        assert isinstance(box.list_events(type="script.failed"), list)
        assert box.healthz()["status"] == "ok" and box.readyz()
