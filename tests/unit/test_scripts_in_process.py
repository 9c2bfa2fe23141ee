"""The script library run through the worker's real path on the in-process stack: a script's
outputs checked against its schema, a plan step running the proven version to its end, and a
weekly schedule that stays quiet until a log changes format, then raises a `script.failed` event
and delivers it to the schedule's webhook. The registered program is faked in Python (`report`
below does what REPORT does); the scheduler is stepped on a clock the test moves."""

from __future__ import annotations

import io
import json
import secrets
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from execbox.executions.inputs import INPUTS_FILE
from execbox.sandbox.fake import Script
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec
from execbox.schedules import calendar
from execbox.schedules.scheduler import Scheduler
from tests.conftest import Redis, wait_until
from tests.report_script import REPORT, logs, register
from tests.unit.stack import InStack, in_stack
from tests.unit.test_webhooks_in_process import LOOPBACK, Receiver, delivering

pytestmark = pytest.mark.redis


def report(spec: SandboxSpec) -> Script:
    """What REPORT does in a sandbox, read from what the sandbox is given: the inputs file and the
    uploaded logs (the input archive)."""
    inputs = json.loads(dict(spec.files)[INPUTS_FILE])
    given: dict[str, str] = {}
    if spec.input_archive:
        with tarfile.open(fileobj=io.BytesIO(spec.input_archive)) as tar:
            for member in tar:
                data = tar.extractfile(member) if member.isreg() else None
                if data is not None:
                    given[member.name] = data.read().decode()
    errors: dict[str, int] = {}
    unreadable: list[dict[str, str]] = []
    for path in sorted(inputs["logs"]):
        if path not in given:
            trace = f"Traceback (most recent call last):\nFileNotFoundError: {path!r}\n"
            return Script(stderr=trace, exit_code=1)
        lines = given[path].splitlines()
        parsed = [line for line in lines if line[:4] in ("INFO", "WARN", "ERRO")]
        if lines and not parsed:
            unreadable.append({"file": path, "first_line": lines[0][:80]})
        errors[path] = sum(1 for line in parsed if line.startswith("ERRO"))
    if unreadable:
        message = "logs in a format this report does not read"
        return Script(stderr=f"CheckFailed: {message}\n", exit_code=1,
                      check={"message": message, "details": {"unreadable": unreadable}})  # fmt: skip
    written = "# Errors\n" + "".join(f"- {p}: {n}\n" for p, n in errors.items())
    return Script(files={"out/report.md": written.encode()}, outputs={"errors": sum(errors.values())})


def program(inproc: InStack, monkeypatch: pytest.MonkeyPatch, code: str, does: Callable[[SandboxSpec], Script]) -> None:
    """Runs of `code` on the fake sandbox do what `does` makes of each run's spec."""
    run = inproc.fake.run

    def decided(spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        if spec.files and spec.files[0][1] == code.encode():  # the worker puts the program first
            inproc.fake.scripts[spec.execution_id] = does(spec)
        return run(spec, control)

    monkeypatch.setattr(inproc.fake, "run", decided)


def test_outputs_that_break_the_schema_are_output_invalid(inproc: InStack) -> None:
    name = f"reports.bad_{secrets.token_hex(3)}"
    code = "import execbox\nexecbox.emit('errors', 'many')\n"
    inproc.fake.scripts[code] = Script(outputs={"errors": "many"})
    with inproc.client() as api, inproc.working():
        register(api, name, code=code)
        ran = api.post(f"/v1/scripts/{name}/invoke?wait=20", json={"version": "1.0.0", "inputs": {"logs": []}}).json()

    assert ran["status"] == "failed" and ran["error"]["category"] == "output.invalid", ran
    assert [s.execution_id for s in inproc.fake.runs] == [ran["id"]], "it ran; its outputs were refused after"


def test_a_plan_step_runs_the_proven_script_to_its_end(inproc: InStack, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"reports.plan_{secrets.token_hex(3)}"
    program(inproc, monkeypatch, REPORT, report)
    with inproc.client() as api, inproc.working():
        register(api, name)
        first = api.post(f"/v1/scripts/{name}/invoke?wait=20", json={"version": "1.0.0", "inputs": {"logs": []}}).json()
        assert first["status"] == "succeeded" and first["outputs"] == {"errors": 0}, first
        api.post(f"/v1/scripts/{name}/versions/1.0.0/promote", json={"status": "proven", "evidence": [first["id"]]})
        register(api, name, version="1.1.0")  # a draft: not used by @proven
        files = logs(api, {"c.log": "ERRO one\n"})
        plan = {"format": "plan/v1", "steps": [{"id": "report", "run": {"script": f"{name}@proven"},
                                                "args": {"logs": ["c.log"]}, "files": files}]}  # fmt: skip
        run = api.post("/v1/runs", json={"plan": plan}).json()
        run = api.get(f"/v1/runs/{run['id']}?wait=20").json()

    assert run["status"] == "succeeded", run
    assert run["steps"]["report"]["script"] == f"{name}@1.0.0" and run["steps"]["report"]["outputs"] == {"errors": 1}


def test_the_weekly_report_fires_quietly_until_a_log_changes_format(
    redis_server: Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mondays at 7 in Oslo: the scheduler (stepped here on a clock the test moves to each slot)
    fires the report; the API's surprises consumer turns the failed firing into an event, the
    worker's webhook consumer delivers it to the schedule's webhook."""
    name = f"reports.weekly_{secrets.token_hex(3)}"
    cron, zone = "0 0 7 * * 1", "Europe/Oslo"
    with (
        in_stack(redis_server, tmp_path, webhooks=LOOPBACK) as inproc,
        inproc.client() as api,
        Receiver() as hooks,
        delivering(inproc),
    ):
        program(inproc, monkeypatch, REPORT, report)
        register(api, name)
        plain = {"a.log": "INFO start\nERRO disk\n", "b.log": "WARN hot\n"}
        hook = {"url": hooks.url, "secret": "weekly-hook-secret-0123"}
        schedule = api.post("/v1/schedules", json={
            "script": f"{name}@1.0.0", "cron": cron, "timezone": zone,
            "inputs": {"logs": list(plain)}, "files": logs(api, plain), "webhook": hook}).json()  # fmt: skip
        assert schedule["id"].startswith("sch_"), schedule
        services = inproc.app.app.state.services
        clock = Slots(cron, zone)  # the API's own scheduler, on the real clock, sees no slot for days
        scheduler = Scheduler(services.schedules.store, services.scripts, services.store, clock=clock)

        def fire() -> dict[str, Any]:
            """The next slot: the scheduler's tick at it, and the worker's run of what it fired."""
            clock.next()
            scheduler.tick()
            fired = api.get(f"/v1/schedules/{schedule['id']}/firings").json()[-1]
            assert fired["status"] == "fired" and fired["slot"] == clock.now, fired
            assert inproc.run_all() == [fired["execution_id"]]
            done: dict[str, Any] = api.get(f"/v1/executions/{fired['execution_id']}").json()
            return done

        quiet = [fire(), fire()]
        assert [q["status"] for q in quiet] == ["succeeded", "succeeded"], quiet
        assert [q["outputs"] for q in quiet] == [{"errors": 1}, {"errors": 1}]

        changed = {**plain, "b.log": json.dumps({"level": "warn", "msg": "hot"}) + "\n"}
        assert api.patch(f"/v1/schedules/{schedule['id']}", json={"files": logs(api, changed)}).status_code == 200
        loud = fire()
        assert loud["status"] == "failed" and loud["error"]["category"] == "check.failed", loud

        def surprise() -> list[dict[str, Any]]:
            return [e for e in api.get("/v1/events?type=script.failed").json() if e["schedule"] == schedule["id"]]

        surprises: Any = wait_until(surprise, 10, "the surprise of the changed log")
        event = surprises[0]
        assert event["error"]["category"] == "check.failed" and event["script"] == f"{name}@1.0.0"
        assert event["error"]["details"]["details"]["unreadable"][0]["file"] == "b.log"
        assert event["slot"] == clock.now and event["inputs"] == {"logs": ["a.log", "b.log"]}
        assert event["execution_id"] == loud["id"]
        ours = [e for e in api.get("/v1/events").json() if e["schedule"] == schedule["id"]]
        assert ours == [event], "quiet firings make no event (the consumer read theirs before the surprise's)"
        wait_until(lambda: any(h.get("Execbox-Event") == "script.failed" for _, h, _ in hooks.calls), 10, "the webhook")
        body = next(json.loads(b) for _, h, b in hooks.calls if h.get("Execbox-Event") == "script.failed")
        assert body["event"]["execution_id"] == event["execution_id"] and "b.log" in json.dumps(body)
        assert all(h.get("Execbox-Event") == "script.failed" for _, h, _ in hooks.calls), "quiet firings sent nothing"
        api.post(f"/v1/schedules/{schedule['id']}/pause")
        firings = api.get(f"/v1/schedules/{schedule['id']}/firings").json()
    assert len(firings) == 3 and len({f["slot"] for f in firings}) == len(firings), "no slot handled twice"


class Slots:
    """A clock that stands on a calendar's slots, moved to the next one by the test."""

    def __init__(self, cron: str, zone: str) -> None:
        self.now = time.time()
        self._slots = calendar.slots(cron, zone, self.now)

    def next(self) -> None:
        self.now = next(self._slots)

    def __call__(self) -> float:
        return self.now
