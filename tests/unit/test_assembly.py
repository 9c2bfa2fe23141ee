"""The control plane's one assembly (execbox.assembly): what `execbox scheduler` runs without the
API's app, and what the API builds its app around."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import redis
from prometheus_client import CollectorRegistry

from execbox.api import create_app
from execbox.assembly import assemble
from execbox.library.schemas import ScriptCreate
from execbox.schedules.schemas import ScheduleCreate
from execbox.settings import Settings
from tests.conftest import wait_until

pytestmark = pytest.mark.redis


def test_the_scheduler_command_imports_no_web_framework_and_no_engine_client() -> None:
    probe = (
        "import sys, execbox.assembly, execbox.cli\n"
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn', 'docker') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_a_plane_assembled_for_the_scheduler_fires_a_due_schedule_into_the_queue(
    settings: Settings, client: redis.Redis
) -> None:
    plane = assemble(settings, CollectorRegistry(), component="scheduler")
    stop = threading.Event()
    loop = threading.Thread(target=plane.schedules.run, args=(stop,), daemon=True)  # as `execbox scheduler` runs it
    try:
        script = ScriptCreate(name="tick", version="1.0.0", code="print(1)", input_schema={"type": "object"})
        plane.scripts.register("alpha", script, plane.policies.names)
        schedule = plane.schedules.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * * *"))
        loop.start()
        wait_until(lambda: plane.schedules.store.firings(schedule.id), 10, "a firing of the every-second schedule")
        fired = plane.schedules.store.firings(schedule.id)[0]
        record = plane.store.get(str(fired.execution_id))
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(5)  # no slot fires after the test's keys are gone
        plane.close()
    assert record is not None and record.tenant == "alpha" and record.status == "queued", record


def test_the_api_serves_the_objects_of_its_one_plane(settings: Settings) -> None:
    services = create_app(settings).state.services

    assert services.runs.executor.submissions is services.executions  # one Submissions, not one per user
    assert services.schedules.library is services.scripts and services.scripts.submissions is services.executions
    assert services.sessions is services.executions.sessions and services.files is services.executions.files
