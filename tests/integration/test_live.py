"""Live events (SSE) against the real stack: output arrives while the program runs, a reconnect
with Last-Event-ID resumes without loss or duplicates, the end event is the stored record."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import EXECBOX, Processes, Stack, answers_200, auth, free_port, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]
TICKS = "import time\nfor i in range(30):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.1)\n"
ALL_TICKS = "".join(f"tick {i}\n" for i in range(30))


@dataclass
class Event:
    id: str | None
    event: str
    data: Any
    at: float


def read_events(client: httpx.Client, execution_id: str, last_id: str | None = None, stop_after: int | None = None,
                comments: list[str] | None = None) -> list[Event]:  # fmt: skip
    """Read the stream until its end event (or `stop_after` events, then hang up)."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events: list[Event] = []
    fields: dict[str, str] = {}
    with client.stream("GET", f"/v1/executions/{execution_id}/events", headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith(":"):
                if comments is not None:
                    comments.append(line)
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if not fields:
                continue
            events.append(Event(fields.get("id"), fields["event"], json.loads(fields["data"]), time.monotonic()))
            fields = {}
            if events[-1].event == "end" or (stop_after is not None and len(events) >= stop_after):
                break
    return events


def submit(client: httpx.Client, code: str, **extra: Any) -> str:
    response = client.post("/v1/executions", json={"language": "python", "code": code, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def text_of(events: list[Event], stream: str = "stdout") -> str:
    return "".join(e.data["text"] for e in events if e.event == stream)


def test_output_arrives_while_the_program_runs_and_end_is_the_record(api: httpx.Client) -> None:
    execution_id = submit(api, TICKS)
    events = read_events(api, execution_id)

    assert [e.event for e in events][0] == "status" and events[0].data == {"status": "queued"}
    assert [e.event for e in events].count("end") == 1 and events[-1].event == "end"
    assert text_of(events) == ALL_TICKS
    output = [e for e in events if e.event == "stdout"]
    assert len(output) >= 10, "line by line, not all at the end"
    assert output[-1].at - output[0].at > 2.0, "arrival times spread over the three-second run"
    ids = [tuple(int(p) for p in e.id.split("-")) for e in events if e.id]
    assert ids == sorted(ids) and len(set(ids)) == len(events), "monotonic, one id per event"
    stored = api.get(f"/v1/executions/{execution_id}").json()
    assert events[-1].data == stored, "the end event carries the record GET returns"
    statuses = [e.data["status"] for e in events if e.event == "status"]
    assert statuses == ["queued", "running", "succeeded"]


def test_a_reconnect_with_last_event_id_resumes_without_loss_or_duplicates(api: httpx.Client) -> None:
    execution_id = submit(api, TICKS)
    first = read_events(api, execution_id, stop_after=6)  # hangs up mid-run
    assert first[-1].event != "end"
    rest = read_events(api, execution_id, last_id=first[-1].id)
    whole = read_events(api, execution_id)  # after the end: everything, then end at once
    assert [e.id for e in first + rest] == [e.id for e in whole]
    assert text_of(first + rest) == ALL_TICKS
    assert api.get(f"/v1/executions/{execution_id}").json()["status"] == "succeeded", "the hang-up did not stop it"


def test_keepalives_truncation_and_an_unknown_execution(api: httpx.Client, stack: Any) -> None:
    comments: list[str] = []
    quiet = submit(api, "import time\ntime.sleep(2.5)\nprint('done')")
    events = read_events(api, quiet, comments=comments)
    assert comments and all(c == ": keepalive" for c in comments), comments
    assert text_of(events) == "done\n"

    flood = submit(api, "import sys\nsys.stdout.write('x' * 10000)\nsys.stdout.flush()", policy={"output_bytes": 4096})
    events = read_events(api, flood)
    assert [e.data for e in events if e.event == "truncated"] == [{"stream": "stdout", "cap_bytes": 4096}]
    assert len(text_of(events)) == 4096, "nothing of the stream past its cap"
    assert events[-1].data["error"]["category"] == "limit.output"

    assert api.get("/v1/executions/exe_" + "a" * 26 + "/events").status_code == 404
    with stack.client("beta") as other:
        assert other.get(f"/v1/executions/{quiet}/events").status_code == 404, "another tenant's"


def test_a_session_call_streams_too(api: httpx.Client) -> None:
    session = api.post("/v1/sessions", json={"language": "python"}).json()
    try:
        execution_id = submit(api, TICKS + "'finished'", session=session["id"])
        events = read_events(api, execution_id)
        assert text_of(events) == ALL_TICKS
        output = [e for e in events if e.event == "stdout"]
        assert output[-1].at - output[0].at > 2.0
        results = [e.data for e in events if e.event == "result"]
        assert results and results[0]["data"]["text/plain"]["text"] == "'finished'"
        assert [e.event for e in events][-2:] == ["status", "end"]
    finally:
        api.delete(f"/v1/sessions/{session['id']}")


def test_sigterm_ends_an_api_with_an_open_event_stream_once_its_shutdown_grace_passes(
    stack: Stack, processes: Processes
) -> None:
    """An event stream never ends by itself: without a bound, uvicorn waited for it forever and the
    orchestrator (or this test session) had to kill the API."""
    queue = f"{stack.prefix}-{secrets.token_hex(3)}"  # no worker listens: the execution stays queued
    env = {**stack.env, "EXECBOX_QUEUE__NAME": queue, "EXECBOX_API__SHUTDOWN_GRACE_S": "1"}
    port = free_port()
    api = processes.spawn(f"api-{queue}", [EXECBOX, "api", "--port", str(port)], env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{base_url}/healthz"), 20, "the API to answer")
    with httpx.Client(base_url=base_url, timeout=30, headers=auth(stack.keys["alpha"])) as client:
        queued = client.post("/v1/executions", json={"language": "python", "code": "1"}).json()
        opened = threading.Event()

        def listen() -> None:
            with (
                contextlib.suppress(httpx.HTTPError),
                client.stream("GET", f"/v1/executions/{queued['id']}/events") as r,
            ):
                opened.set()
                for _ in r.iter_lines():
                    pass

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        assert opened.wait(10), "the event stream opened"
        stopping = time.monotonic()
        api.send_signal(signal.SIGTERM)
        api.wait(15)
        took = time.monotonic() - stopping
        listener.join(5)
    # The grace (1 s), then the app's own shutdown: its background loops get at most 10 s to stop.
    assert took < 11, f"the API took {took:.1f} s to stop with a stream open (grace 1 s)"
    assert not listener.is_alive(), "the client's stream ended with the API"
