"""The worker's real code path without Docker: the API in-process, the worker's job function and
threads in-process, and the in-memory sandbox (execbox.sandbox.fake) behind the runtime seam. A
POST becomes a terminal execution, a plan advances through three steps, a session's two calls
share state, and a webhook reaches a local receiver."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from execbox.core.metrics import loop_metrics
from execbox.core.poison import Loops
from execbox.executions.outputs import INLINE_OUTPUT_BYTES
from execbox.executions.status import ExecutionStatus
from execbox.keyschema import LOOPS
from execbox.sandbox.fake import Script, interpret
from execbox.sessions.host import SessionHost
from execbox.settings import Settings
from execbox.webhooks.delivery import WebhookConsumer
from execbox.worker.reaper import report_health
from tests.conftest import Redis, free_port, wait_until
from tests.unit.conftest import InProcess
from tests.unit.stack import FakeWorker as Worker
from tests.unit.stack import in_stack

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The unit settings, with webhooks to loopback allowed (the receiver below listens there)."""
    hooks = settings.webhooks.model_copy(update={"allow_hosts": ["127.0.0.1"], "backoff_s": 0.2})
    return settings.model_copy(update={"webhooks": hooks})


def submit(api: Api, body: dict[str, Any], tenant: str = "alpha") -> dict[str, Any]:
    http, headers = api
    answer = http.post("/v1/executions", json={"language": "python", **body}, headers=headers[tenant])
    assert answer.status_code in (201, 202), answer.text
    created: dict[str, Any] = answer.json()
    return created


def get(api: Api, execution_id: str, tenant: str = "alpha") -> dict[str, Any]:
    http, headers = api
    body: dict[str, Any] = http.get(f"/v1/executions/{execution_id}", headers=headers[tenant]).json()
    return body


def test_the_fake_interprets_prints_assignments_and_exits() -> None:
    names: dict[str, Any] = {}
    assert interpret("x = 41\nprint('x is', x)", names).stdout == "x is 41\n" and names == {"x": 41}
    assert interpret("print(1)\nraise SystemExit(3)\nprint(2)", {}).exit_code == 3
    unknown = interpret("import os", {})
    assert unknown.exit_code == 1 and "NotImplementedError" in unknown.stderr and "fake sandbox" in unknown.stderr


def test_a_posted_execution_ends_through_the_worker_with_its_stdout(api: Api, worker: Worker) -> None:
    created = submit(api, {"code": "print('hello')"})
    assert created["status"] == "queued"

    assert worker.run_one() == created["id"]

    done = get(api, created["id"])
    assert done["status"] == "succeeded", done
    assert done["stdout"] == "hello\n" and done["exit_code"] == 0 and done["error"] is None
    assert done["worker"] == "w-fake" and done["image"] == "sha256:fake"
    assert worker.run_one() == "nothing to run"


def test_declared_outputs_checks_and_artifacts_are_read_as_from_a_real_sandbox(api: Api, worker: Worker) -> None:
    worker.fake.scripts["make()"] = Script(outputs={"rows": 3}, files={"out/report.txt": b"three rows\n"})
    worker.fake.scripts["judge()"] = Script(check={"message": "rows differ", "details": {"want": 4}})
    worker.fake.scripts["crash()"] = Script(stderr="Traceback (most recent call last):\nKeyError: 'a'\n", exit_code=1)
    made = submit(api, {"code": "make()"})
    judged = submit(api, {"code": "judge()"})
    crashed = submit(api, {"code": "crash()"})
    for _ in range(3):
        worker.run_one()

    made_done, judged_done, crashed_done = (get(api, e["id"]) for e in (made, judged, crashed))
    assert made_done["status"] == "succeeded" and made_done["outputs"] == {"rows": 3}, made_done
    (artifact,) = made_done["artifacts"]
    assert artifact["name"] == "report.txt" and artifact["size"] == len(b"three rows\n")
    http, headers = api
    assert http.get(artifact["url"], headers=headers["alpha"]).content == b"three rows\n"
    assert judged_done["status"] == "failed" and judged_done["error"]["category"] == "check.failed", judged_done
    assert crashed_done["status"] == "failed" and crashed_done["error"]["category"] == "code.exception", crashed_done


def test_a_large_output_is_written_once_before_the_terminal_transaction_even_when_it_retries(
    api: Api, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome is decided (its blobs written) before the WATCH/MULTI loop; a concurrent write
    to the record makes the loop run the change again, which writes nothing a second time."""
    worker.fake.scripts["big()"] = Script(outputs={"big": "x" * INLINE_OUTPUT_BYTES})
    created = submit(api, {"code": "big()"})
    store, artifacts = worker.ctx.store, worker.ctx.artifacts
    puts: list[tuple[str, bool]] = []  # (blob name, written inside the transaction)
    changes: list[str] = []
    inside: list[bool] = []
    real_put, real_transition = artifacts.put, store.transition

    def put(execution_id: str, name: str, data: Any, size: int) -> tuple[int, str]:
        puts.append((name, bool(inside)))
        return real_put(execution_id, name, data, size)

    def transition(execution_id: str, allowed: Any, by: str, mutate: Any, lease: bool = False) -> Any:
        if ExecutionStatus.RUNNING not in allowed:
            return real_transition(execution_id, allowed, by, mutate, lease)

        def racing(record: Any) -> Any:
            changes.append(execution_id)
            inside.append(True)
            try:
                if len(changes) == 1:
                    store.update(execution_id, lambda r: None)  # another writer: this commit will fail
                return mutate(record)
            finally:
                inside.pop()

        return real_transition(execution_id, allowed, by, racing, lease)

    monkeypatch.setattr(artifacts, "put", put)
    monkeypatch.setattr(store, "transition", transition)
    worker.run_one()

    done = get(api, created["id"])
    assert done["status"] == "succeeded" and done["outputs"]["big"]["artifact"] == "execbox-outputs/big.json", done
    assert len(changes) == 2, "the terminal change ran again after the concurrent write"
    assert puts == [("execbox-outputs/big.json", False)]


def test_a_plan_advances_through_three_steps_run_by_the_worker(api: Api, worker: Worker) -> None:
    http, headers = api
    worker.fake.scripts["fetch()"] = Script(outputs={"rows": [1, 2, 3]})
    worker.fake.scripts["total()"] = Script(outputs={"total": 6})
    worker.fake.scripts["report()"] = Script(stdout="total 6\n", outputs={"sent": True})
    steps = [
        {"id": "fetch", "run": {"code": "fetch()", "language": "python"}},
        {"id": "total", "run": {"code": "total()", "language": "python"},
         "args": {"rows": {"$ref": "/steps/fetch/outputs/rows"}}},
        {"id": "report", "run": {"code": "report()", "language": "python"},
         "args": {"total": {"$ref": "/steps/total/outputs/total"}}},
    ]  # fmt: skip
    created = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}}, headers=headers["alpha"])
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    ran = []
    for _ in steps:  # the API's plan consumer dispatches the next step when the last one's end event arrives
        ran.append(wait_until(lambda: (r := worker.run_one()) != "nothing to run" and r, 10, "the next step"))

    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(f"/v1/runs/{run_id}", headers=headers["alpha"]).json()
        return body if body["status"] != "running" else None

    run: Any = wait_until(finished, 10, "the run to finish")
    assert run["status"] == "succeeded" and run["stop_reason"] == "completed", run
    inputs = [worker.ctx.store.get(str(execution_id)) for execution_id in ran]
    assert [r.inputs if r else None for r in inputs][1:] == [{"rows": [1, 2, 3]}, {"total": 6}]
    assert [s.files[0][1] for s in worker.fake.runs] == [b"fetch()", b"total()", b"report()"]


@pytest.fixture
def session(api: Api, worker: Worker) -> Iterator[str]:
    """A session held by the worker's session host (in a thread, as `execbox worker` runs it)."""
    http, headers = api
    with worker.hosting_sessions():
        opened = http.post("/v1/sessions", json={"language": "python"}, headers=headers["alpha"])
        assert opened.status_code == 201, opened.text
        yield str(opened.json()["id"])


def test_a_sessions_second_call_sees_the_first_calls_variables(api: Api, worker: Worker, session: str) -> None:
    http, headers = api
    first = submit(api, {"code": "x = 20", "session": session})
    done_first = get_when_done(api, first["id"])
    second = submit(api, {"code": "print('x is', x)", "session": session})
    done_second = get_when_done(api, second["id"])
    record = http.get(f"/v1/sessions/{session}", headers=headers["alpha"]).json()

    assert done_first["status"] == "succeeded" and done_first["session"] == session, done_first
    assert done_second["status"] == "succeeded" and done_second["stdout"] == "x is 20\n", done_second
    assert record["executions"] == 2, record
    assert worker.fake.sessions[session].calls == ["x = 20", "print('x is', x)"]


def test_a_session_whose_start_outlasts_its_idle_timeout_still_runs_the_call_that_waits(
    api: Api, worker: Worker
) -> None:
    """Idle time counts from when the sandbox is ready, not from the POST: on a busy host a start
    may take longer than a short idle timeout, and the call queued meanwhile must still run."""
    http, headers = api
    report_health(worker.ctx)
    host = SessionHost(worker.ctx)
    starting, release = threading.Event(), threading.Event()
    open_session = worker.fake.open_session

    def slow_start(spec: Any, session_id: str, start_timeout_s: float) -> Any:
        def aged(record: Any) -> bool:  # as if the start had taken longer than the idle timeout
            record.last_activity_at -= record.idle_timeout_s + 1
            return True

        host.store.update(session_id, aged)
        starting.set()
        release.wait(5)
        return open_session(spec, session_id, start_timeout_s)

    worker.fake.open_session = slow_start  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
    thread.start()
    try:
        opened = http.post("/v1/sessions", json={"language": "python", "idle_timeout_s": 5}, headers=headers["alpha"])
        assert opened.status_code == 201, opened.text
        sid = opened.json()["id"]
        assert starting.wait(5), "the worker starts the session's sandbox"
        waiting = submit(api, {"code": "x = 1", "session": sid})
        release.set()
        done = get_when_done(api, waiting["id"])
        record = http.get(f"/v1/sessions/{sid}", headers=headers["alpha"]).json()
        assert done["status"] == "succeeded", done
        assert record["status"] == "ready" and record["last_activity_at"] >= record["ready_at"], record
    finally:
        release.set()
        stop.set()
        thread.join(5)
        host.join(5)


def test_a_stopping_worker_ends_the_sessions_it_holds_at_once(redis_server: Redis, tmp_path: Path) -> None:
    """Its session host's intake sees the stop within one short read, and the host wakes each held
    session from its wait for a next call; before, each took up to 1 s to notice."""
    with in_stack(redis_server, tmp_path, sessions={"per_worker": 8}) as inproc:
        with inproc.hosting_sessions():  # its exit is a worker's stop: the intake ends, then the held sessions
            held = []
            for tenant in ("alpha", "beta", "gamma") * 2:  # a tenant may hold half of the slots others leave
                with inproc.client(tenant) as http:
                    opened = http.post("/v1/sessions", json={"language": "python"})
                    assert opened.status_code == 201, opened.text
                    held.append((tenant, opened.json()["id"]))

            def sessions() -> list[dict[str, Any]]:
                found = []
                for tenant, sid in held:
                    with inproc.client(tenant) as http:
                        found.append(http.get(f"/v1/sessions/{sid}").json())
                return found

            wait_until(lambda: all(s["status"] == "ready" for s in sessions()), 10, "six sessions held")
            began = time.monotonic()
        took = time.monotonic() - began
        ended = sessions()

    assert [(s["status"], s["end_reason"]) for s in ended] == [("ended", "sandbox_error")] * 6, ended
    assert took < 0.5, f"the held sessions ended {took:.2f} s after the stop"


def test_a_sessions_call_keeps_as_artifacts_only_the_files_it_wrote(api: Api, worker: Worker, session: str) -> None:
    worker.fake.scripts["draw()"] = Script(files={"out/a.png": b"first"})
    worker.fake.scripts["plot()"] = Script(files={"out/b.png": b"second"})
    first = get_when_done(api, submit(api, {"code": "draw()", "session": session})["id"])
    second = get_when_done(api, submit(api, {"code": "plot()", "session": session})["id"])

    assert [a["name"] for a in first["artifacts"]] == ["a.png"], first
    assert [a["name"] for a in second["artifacts"]] == ["b.png"], "a.png is still in out/ but was not this call's"
    assert set(worker.fake.sessions[session].workspace.files) >= {"out/a.png", "out/b.png"}, "the workspace is kept"


def test_a_cancel_stops_a_running_execution_through_the_workers_watcher(api: Api, worker: Worker) -> None:
    http, headers = api
    held = threading.Event()  # never set: only the cancel ends the run
    worker.fake.scripts["wait()"] = Script(hold=held)
    created = submit(api, {"code": "wait()"})
    runner = threading.Thread(target=worker.run_one, daemon=True)
    runner.start()
    wait_until(lambda: get(api, created["id"])["status"] == "running", 10, "the run to start")

    answer = http.post(f"/v1/executions/{created['id']}/cancel", headers=headers["alpha"])
    done = get_when_done(api, created["id"])
    runner.join(10)

    assert answer.status_code == 202, answer.text
    assert done["status"] == "cancelled" and done["error"]["category"] == "cancelled", done
    assert not held.is_set() and not runner.is_alive()


def get_when_done(api: Api, execution_id: str) -> dict[str, Any]:
    http, headers = api
    body: dict[str, Any] = http.get(f"/v1/executions/{execution_id}?wait=10", headers=headers["alpha"]).json()
    assert body["status"] not in ("queued", "running"), body
    return body


class Receiver:
    """A webhook receiver on loopback that keeps each delivery (headers and body)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        deliveries, arrived = self.deliveries, self.arrived

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                deliveries.append((dict(self.headers.items()), body))
                arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_finished_execution_is_delivered_signed_to_its_webhook(api: Api, worker: Worker, settings: Settings) -> None:
    receiver = Receiver()
    secret = "s" * 24
    webhook = {"url": f"http://127.0.0.1:{receiver.port}/hook", "secret": secret}
    created = submit(api, {"code": "print(7)", "webhook": webhook})
    stop = threading.Event()
    loops = Loops(stop, LOOPS, loop_metrics(CollectorRegistry()))
    loops.start(
        "webhooks",
        WebhookConsumer(worker.ctx.store, settings.webhooks, "w-fake", loop_metrics(CollectorRegistry())).run,
    )
    try:
        worker.run_one()
        assert receiver.arrived.wait(10), "no delivery within 10 s"
    finally:
        stop.set()
        loops.join(5)
        receiver.server.shutdown()
        receiver.server.server_close()
    ((headers, body),) = receiver.deliveries
    delivered = json.loads(body)
    assert headers["Execbox-Execution-Id"] == created["id"]
    assert delivered["status"] == "succeeded" and delivered["stdout"] == "7\n", delivered
    fields = dict(part.split("=", 1) for part in headers["Execbox-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(fields["v1"], expected)
