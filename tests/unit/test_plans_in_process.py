"""Plans on the in-process stack (tests/unit/stack.py): the API's own plan consumer advances each
run from the event stream, the worker's real code runs every step on the fake sandbox, and each
step's program is played by a function of the inputs and files the worker handed the sandbox
(`programs`). Approvals, artifacts passed between steps, run webhooks, saved traces and budgets.

The end-to-end plan (real Python in real sandboxes, outputs passed between steps, a check that
stops the run and a revision that finishes it) and the tests that kill an API or a worker process
stay in tests/integration/test_plans.py."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from execbox.core.metrics import loop_metrics
from execbox.executions.inputs import INPUTS_FILE
from execbox.sandbox.fake import Script
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec
from execbox.webhooks.delivery import WebhookConsumer
from tests.conftest import ROOT, Redis, free_port, policies_with_tenants, wait_until
from tests.unit.stack import InStack, in_stack

pytestmark = pytest.mark.redis


# -- programs that read what the sandbox was given ---------------------------------------------------


@dataclass
class Given:
    """What a step's program finds in its sandbox: its inputs and the workspace's files."""

    inputs: Any
    files: dict[str, bytes]
    env: dict[str, str]


Program = Callable[[Given], Script]


def programs(inproc: InStack, monkeypatch: pytest.MonkeyPatch, table: Mapping[str, Program]) -> None:
    """Each run whose code (stripped) is a key of `table` does what its function answers for the
    inputs and files the worker put in the sandbox (a fake Script is a fixed answer; a plan's step
    must show that its arguments and artifacts really arrived)."""
    fake = inproc.fake
    real_run = fake.run

    def run(spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        code = spec.files[0][1].decode() if spec.files else ""
        program = table.get(code.strip())
        if program is not None:
            files = dict(spec.files)
            if spec.input_archive:
                with tarfile.open(fileobj=io.BytesIO(spec.input_archive)) as tar:
                    for member in tar:
                        data = tar.extractfile(member) if member.isreg() else None
                        if data is not None:
                            files[member.name] = data.read()
            inputs = json.loads(files[INPUTS_FILE]) if INPUTS_FILE in files else None
            fake.scripts[spec.execution_id] = program(Given(inputs, files, dict(spec.env)))
        return real_run(spec, control)

    monkeypatch.setattr(fake, "run", run)


def emits(**outputs: Any) -> Script:
    """A program that ends well with these outputs (execbox.emit)."""
    return Script(outputs=outputs)


def checked(message: str, outputs: Mapping[str, Any] | None = None, **details: Any) -> Script:
    """A program whose execbox.check failed (after emitting `outputs`): the helper writes the check
    to the result file and exits 1."""
    return Script(outputs=outputs, check={"message": message, "details": details}, exit_code=1)


def raises(error: str) -> Script:
    """A program that ends with an uncaught exception."""
    return Script(stderr=f"Traceback (most recent call last):\n{error}\n", exit_code=1)


# -- the API -----------------------------------------------------------------------------------------


def start(api: httpx.Client, plan: dict[str, Any], **extra: Any) -> str:
    created = api.post("/v1/runs", json={"plan": plan, **extra})
    assert created.status_code == 201, created.text
    run_id: str = created.json()["id"]
    return run_id


def settled(api: httpx.Client, run_id: str, wait_s: float = 20) -> dict[str, Any]:
    """The run once it no longer runs (the server's own wait)."""
    run: dict[str, Any] = api.get(f"/v1/runs/{run_id}", params={"wait": wait_s}).json()
    assert run["status"] != "running", run
    return run


class Receiver:
    """A webhook receiver on loopback that keeps each delivery (headers and body)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                calls.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooked(redis_server: Redis, tmp_path: Path) -> Iterator[tuple[InStack, Receiver]]:
    """A stack whose webhooks may reach loopback, the real delivery loop running beside it (the
    worker's, which InStack does not start), and a receiver there. Its tenants may schedule a
    firing every second, as the integration stack's may."""
    shipped = (ROOT / "policies" / "tenants.yaml").read_text()
    policies = policies_with_tenants(
        tmp_path, shipped.replace("default:\n", "default:\n  schedule_min_interval_s: 1\n", 1)
    )
    receiver = Receiver()
    stop = threading.Event()
    hooks = {"allow_hosts": ["127.0.0.1"], "backoff_s": 0.2}
    with in_stack(redis_server, tmp_path, webhooks=hooks, policies_dir=policies) as inproc:
        consumer = WebhookConsumer(inproc.worker.store, inproc.settings.webhooks, "w-fake",
                                   loop_metrics(CollectorRegistry()))  # fmt: skip
        delivery = threading.Thread(target=consumer.run, args=(stop,), name="webhooks", daemon=True)
        delivery.start()
        try:
            yield inproc, receiver
        finally:
            stop.set()
            delivery.join(10)
            receiver.close()


def signed_by(secret: str, headers: dict[str, str], body: bytes) -> bool:
    stamp, digest = (part.split("=", 1)[1] for part in headers["Execbox-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(digest, expected)


# -- the tests ---------------------------------------------------------------------------------------


def test_an_approval_gated_step_runs_only_once_approved(inproc: InStack, monkeypatch: pytest.MonkeyPatch) -> None:
    programs(inproc, monkeypatch, {"send(to)": lambda given: emits(sent=given.inputs["to"])})
    gated = {"id": "send", "run": {"code": "send(to)"}, "args": {"to": {"$ref": "/inputs/to"}}, "effect": "write",
             "idempotency": {"strategy": "key"}, "approval": {"summary": "send the report"}}  # fmt: skip
    plan = {"format": "plan/v1", "inputs": {"to": "ops@example.com"}, "steps": [gated]}
    with inproc.client() as api, inproc.working():
        waiting = settled(api, start(api, plan))
        assert waiting["status"] == "awaiting_approval" and waiting["steps"]["send"]["attempts"] == []
        assert inproc.fake.runs == [], "nothing ran before the decision"
        approval = api.get(f"/v1/approvals/{waiting['steps']['send']['approval_id']}").json()
        assert approval["args"] == {"to": "ops@example.com"} and "send(to)" in approval["code"]

        api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve", "decided_by": "alice"})
        done = settled(api, waiting["id"])

        assert done["status"] == "succeeded" and done["steps"]["send"]["outputs"] == {"sent": "ops@example.com"}
        rejected = settled(api, start(api, plan))
        api.post(f"/v1/approvals/{rejected['steps']['send']['approval_id']}/decision",
                 json={"decision": "reject", "reason": "not today"})  # fmt: skip
        replan = settled(api, rejected["id"])
    assert replan["status"] == "needs_replan" and replan["steps"]["send"]["attempts"] == []
    assert replan["steps"]["send"]["error"] == {"category": "approval.rejected", "message": "not today",
                                                "retryable": False, "details": {}}  # fmt: skip
    assert len(inproc.fake.runs) == 1, "only the approved step ran"


def test_an_artifact_reaches_a_later_step_without_the_client(inproc: InStack, monkeypatch: pytest.MonkeyPatch) -> None:
    programs(inproc, monkeypatch, {
        "make_csv()": lambda given: Script(files={"out/r.csv": b"a,b\n1,2\n"}),
        "read(csv)": lambda given: emits(text=given.files.get(given.inputs["csv"], b"(no such file)").decode()),
    })  # fmt: skip
    plan = {"format": "plan/v1", "steps": [
        {"id": "make", "run": {"code": "make_csv()"}},
        {"id": "read", "run": {"code": "read(csv)"}, "args": {"csv": {"$artifact": "/steps/make/artifacts/r.csv"}}},
    ]}  # fmt: skip
    with inproc.client() as api, inproc.working():
        run = settled(api, start(api, plan))

    assert run["status"] == "succeeded", run
    assert run["steps"]["read"]["outputs"] == {"text": "a,b\n1,2\n"}
    assert run["steps"]["read"]["args"] == {"csv": "artifacts/make/r.csv"}


def test_run_events_reach_the_runs_webhook_signed(
    hooked: tuple[InStack, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    inproc, hooks = hooked
    programs(inproc, monkeypatch, {"boom()": lambda given: raises("ValueError: no")})
    secret = "run-hook-secret-0123456789"
    hook = {"url": hooks.url, "secret": secret}
    failing = {"format": "plan/v1", "steps": [{"id": "boom", "run": {"code": "boom()"}}]}
    gated = {"format": "plan/v1", "steps": [{"id": "g", "run": {"code": "print(1)"}, "approval": {}}]}
    with inproc.client() as api, inproc.working():
        failed = settled(api, start(api, failing, webhook=hook))
        api.post(f"/v1/runs/{failed['id']}/cancel")
        waiting = start(api, gated, webhook=hook)

        def events() -> list[tuple[str, str]]:
            return sorted((h["Execbox-Event"], h["Execbox-Run-Id"]) for h, _ in hooks.calls)

        expected = sorted([("run.needs_replan", failed["id"]), ("run.finished", failed["id"]),
                           ("approval.requested", waiting)])  # fmt: skip
        wait_until(lambda: events() == expected, 20, "the three run events to be delivered")
        bad = api.post("/v1/runs", json={"plan": gated, "webhook": {**hook, "url": "http://elsewhere.example/x"}})

    assert all(signed_by(secret, headers, body) for headers, body in hooks.calls)
    payloads = {h["Execbox-Event"]: json.loads(b) for h, b in hooks.calls}
    assert payloads["run.needs_replan"]["handoff"]["failed"][0]["error"]["category"] == "code.exception"
    assert payloads["run.finished"]["run"]["status"] == "cancelled"
    assert payloads["approval.requested"]["approval"]["step_id"] == "g"
    assert "secret" not in json.dumps(payloads), "the webhook's secret never travels"
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "webhook.url"


# Saved traces: plans, what the agent did along the way and the transitions a real run recorded. The
# programs their steps run, as functions of their inputs.
TRACES = Path(__file__).parent / "traces"
TRACE_PROGRAMS: dict[str, Program] = {
    "import execbox\nexecbox.emit('amount', execbox.inputs['amount'])": lambda g: emits(amount=g.inputs["amount"]),
    "import execbox\nexecbox.emit('paid', execbox.inputs['amount'])": lambda g: emits(paid=g.inputs["amount"]),
    "import execbox\nexecbox.emit('rows', [3, 1, 2])": lambda g: emits(rows=[3, 1, 2]),
    "import execbox\nrows = execbox.inputs['rows']\nexecbox.check(rows == sorted(rows), 'rows are not sorted', "
    "rows=rows)\nexecbox.emit('rows', rows)": lambda g: (
        emits(rows=g.inputs["rows"]) if g.inputs["rows"] == sorted(g.inputs["rows"])
        else checked("rows are not sorted", rows=g.inputs["rows"])),
    "import execbox\nexecbox.emit('first', execbox.inputs['rows'][0])": lambda g: emits(first=g.inputs["rows"][0]),
    "import execbox\nrows = sorted(execbox.inputs['rows'])\nexecbox.check(rows == sorted(rows), 'rows are not "
    "sorted')\nexecbox.emit('rows', rows)": lambda g: emits(rows=sorted(g.inputs["rows"])),
    "import execbox\nexecbox.emit('rows', list(range(execbox.inputs['n'])))": lambda g: emits(
        rows=list(range(g.inputs["n"]))),
    "import execbox\nexecbox.emit('sum', sum(execbox.inputs['rows']))": lambda g: emits(sum=sum(g.inputs["rows"])),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(p.stem for p in TRACES.glob("*.json")))
def test_a_saved_trace_replays_with_the_same_transitions(
    inproc: InStack, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Each trace holds a plan, what the agent did along the way and the transitions a real run
    recorded; replaying it must record the same ones (EXECBOX_RECORD_TRACES=1 saves them anew)."""
    programs(inproc, monkeypatch, TRACE_PROGRAMS)
    path = TRACES / f"{name}.json"
    trace = json.loads(path.read_text())
    with inproc.client() as api, inproc.working():
        run = settled(api, start(api, trace["plan"]))
        for action in trace["actions"]:
            assert run["status"] == action["when"], run
            if "revise" in action:
                assert api.post(f"/v1/runs/{run['id']}/revisions", json=action["revise"]).status_code == 200
            else:
                step = next(s for s in run["steps"].values() if s["status"] == "awaiting_approval")
                api.post(f"/v1/approvals/{step['approval_id']}/decision", json=action["decide"])
            run = settled(api, run["id"])
    transitions = [[e["type"], e["step"], e["status"]] for e in run["events"]]
    if os.environ.get("EXECBOX_RECORD_TRACES") == "1":
        path.write_text(json.dumps({**trace, "transitions": transitions}, indent=1) + "\n")
    assert run["status"] == trace["final"]
    assert transitions == trace["transitions"]


def test_the_wall_budget_stops_a_run_and_cancels_its_running_step(inproc: InStack) -> None:
    forever = threading.Event()  # the step's program runs until it is stopped
    inproc.fake.scripts["sleep(25)"] = Script(hold=forever)
    slow = {"id": "slow", "run": {"code": "sleep(25)"}, "policy": {"timeout_s": 30}}
    plan = {"format": "plan/v1", "budgets": {"max_wall_s": 0.5}, "steps": [slow]}
    with inproc.client() as api, inproc.working():
        try:
            run = settled(api, start(api, plan))
            execution = api.get(f"/v1/executions/{run['steps']['slow']['attempts'][0]}?wait=10").json()
            metrics = api.get("/metrics").text
        finally:
            forever.set()  # (a step left running would hold the worker thread)

    assert (run["status"], run["stop_reason"]) == ("failed", "budget_exceeded:wall"), run
    assert run["steps"]["slow"]["status"] == "cancelled"
    assert execution["status"] == "cancelled", "the step's sandbox is stopped, not left to run out its time"
    assert execution["started_at"] is not None, "it was running in its sandbox when the budget ran out"
    assert 'execbox_runs_total{reason="budget_exceeded:wall",status="failed"}' in metrics
    assert 'execbox_run_steps_total{status="cancelled"}' in metrics


def test_step_and_replan_budgets_stop_a_run_with_their_reasons(inproc: InStack) -> None:
    def fails(step_id: str) -> dict[str, Any]:
        return {"id": step_id, "run": {"code": "raise SystemExit(2)"}}

    with inproc.client() as api, inproc.working():

        def revise(run: dict[str, Any], step_id: str) -> httpx.Response:
            return api.post(
                f"/v1/runs/{run['id']}/revisions", json={"base_revision": run["revision"], "add": [fails(step_id)]}
            )

        # A step that expires in the queue every time (its deadline passes before any worker can take
        # it) is retried as a platform failure, until the run's max_steps stops it.
        expiring = {"id": "late", "run": {"code": "print(1)"}, "policy": {"queue_timeout_s": 0.001},
                    "retry": {"max_attempts": 5, "interval_s": 0}}  # fmt: skip
        plan = {"format": "plan/v1", "budgets": {"max_steps": 2}, "steps": [expiring]}
        stopped = settled(api, start(api, plan))
        late = [api.get(f"/v1/executions/{e}").json()["status"] for e in stopped["steps"]["late"]["attempts"]]
        full = settled(api, start(api, {"format": "plan/v1", "budgets": {"max_steps": 1}, "steps": [fails("a")]}))
        no_room = revise(full, "b")

        replans = settled(api, start(api, {"format": "plan/v1", "budgets": {"max_replans": 1}, "steps": [fails("a")]}))
        first = revise(replans, "b")
        second = revise(settled(api, replans["id"]), "c")
        final = api.get(f"/v1/runs/{replans['id']}").json()

    assert (stopped["status"], stopped["stop_reason"]) == ("failed", "budget_exceeded:steps"), stopped
    assert len(stopped["steps"]["late"]["attempts"]) == 2 and stopped["usage"]["steps_dispatched"] == 2
    assert late == ["expired", "expired"], "each attempt expired in the queue"
    assert no_room.status_code == 422 and no_room.json()["errors"][0]["field"] == "revision.budgets.max_steps"
    assert first.status_code == 200
    assert second.status_code == 409 and "re-plan" in second.json()["detail"]
    assert (final["status"], final["stop_reason"], final["usage"]["replans"]) == ("failed", "replans_exhausted", 1)
