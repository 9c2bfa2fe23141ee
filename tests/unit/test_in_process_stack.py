"""The in-process stack itself: what orchestration tests stand on (tests/unit/stack.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from execbox.api import create_app
from execbox.sandbox.fake import Script
from execbox.settings import Settings
from tests.conftest import Redis
from tests.unit.stack import NOTHING, AppLoop, InStack, in_stack

pytestmark = pytest.mark.redis


def test_an_execution_runs_when_the_test_steps_the_worker(inproc: InStack) -> None:
    with inproc.client() as api:
        created = api.post("/v1/executions", json={"language": "python", "code": "print('hi')"})
        assert created.status_code == 202 and created.json()["status"] == "queued", created.text
        assert api.get(f"/v1/executions/{created.json()['id']}").json()["status"] == "queued"
        assert inproc.run_all() == [created.json()["id"]]
        done = api.get(f"/v1/executions/{created.json()['id']}").json()
    assert done["status"] == "succeeded" and done["stdout"] == "hi\n", done
    assert inproc.run_one() == NOTHING


def test_a_waiting_request_is_answered_by_the_worker_thread(inproc: InStack) -> None:
    inproc.fake.scripts["make()"] = Script(stdout="made\n", outputs={"n": 1})
    with inproc.client() as api, inproc.working():
        done = api.post("/v1/executions?wait=20", json={"language": "python", "code": "make()"})
    assert done.status_code == 200 and done.json()["outputs"] == {"n": 1}, done.text


def test_a_plan_runs_to_its_end_through_the_apis_own_consumer(inproc: InStack) -> None:
    steps = [{"id": f"s{i}", "run": {"language": "python", "code": f"print({i})"}} for i in range(3)]
    with inproc.client() as api, inproc.working():
        created = api.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}})
        assert created.status_code == 201, created.text
        run = api.get(f"/v1/runs/{created.json()['id']}?wait=20").json()
    assert run["status"] == "succeeded" and run["stop_reason"] == "completed", run


def test_settings_of_the_tests_own_apply_to_the_api(redis_server: Redis, tmp_path: Path) -> None:
    with in_stack(redis_server, tmp_path, queue={"max_depth": 1}) as inproc, inproc.client() as api:
        assert api.post("/v1/executions", json={"language": "python", "code": "print(1)"}).status_code == 202
        full = api.post("/v1/executions", json={"language": "python", "code": "print(1)"})
    assert full.status_code == 503 and full.json()["code"] == "queue_full", full.text


def test_a_task_left_on_the_apps_loop_is_ended_before_the_loop_closes(settings: Settings) -> None:
    """The API leaves the wait channel's listener behind when its clean-up outlasts LISTENER_CLOSE_S.
    A task left pending on a closed loop is collected later, in whatever test then runs, as an
    unraisable error (what failed CI on 2026-12-07): the stack cancels each until it ends."""
    served = AppLoop(create_app(settings))

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(3600)  # a clean-up that hangs until cancelled again

    async def leave() -> asyncio.Task[None]:
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)  # it runs up to its first wait
        return task

    left = served.call(leave())
    served.close()

    assert left.cancelled() and not asyncio.all_tasks(served.loop), asyncio.all_tasks(served.loop)
