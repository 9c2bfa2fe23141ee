"""The script library on the real stack: registered code run in a real sandbox, its ear
(execbox.check) raising on the surprise it foresees; every slot fired once by scheduler processes
that die and restart. The rest of the library's orchestration (schemas, plan steps, schedules'
surprises and webhooks) is tested on the in-process stack: tests/unit/test_scripts_in_process.py."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from execbox.core.redis_roles import role_url
from tests.conftest import (
    EXECBOX,
    PASSWORDS,
    Processes,
    Stack,
    answers_200,
    as_role,
    auth,
    create_key,
    deployment_env,
    free_port,
    start_redis,
    wait_until,
)
from tests.report_script import logs, register

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def test_a_registered_report_runs_and_raises_on_a_log_it_cannot_read(api: httpx.Client) -> None:
    name = f"reports.errors_{secrets.token_hex(3)}"
    register(api, name)
    plain = {"a.log": "INFO start\nERRO disk\nERRO fan\n", "b.log": "WARN hot\n"}
    quiet = api.post(f"/v1/scripts/{name}/invoke?wait=60", json={"version": "1.0.0", "inputs": {"logs": list(plain)},
                                                                  "files": logs(api, plain)}).json()  # fmt: skip
    assert quiet["status"] == "succeeded" and quiet["outputs"] == {"errors": 2}
    assert [a["name"] for a in quiet["artifacts"]] == ["report.md"]

    changed = {**plain, "b.log": json.dumps({"level": "warn", "msg": "hot"}) + "\n"}
    surprise = api.post(f"/v1/scripts/{name}/invoke?wait=60", json={
        "version": "1.0.0", "inputs": {"logs": list(changed)}, "files": logs(api, changed)}).json()  # fmt: skip
    assert surprise["status"] == "failed" and surprise["error"]["category"] == "check.failed"
    assert surprise["error"]["details"]["details"]["unreadable"][0]["file"] == "b.log"

    promoted = api.post(f"/v1/scripts/{name}/versions/1.0.0/promote",
                        json={"status": "proven", "evidence": [quiet["id"]]})  # fmt: skip
    refused = api.post(f"/v1/scripts/{name}/versions/1.0.0/promote",
                       json={"status": "proven", "evidence": [surprise["id"]]})  # fmt: skip
    assert promoted.status_code == 200 and refused.status_code == 422, "a failed run is no evidence"
    versions = api.get(f"/v1/scripts/{name}").json()["versions"]
    assert versions[0]["uses"] == 2 and versions[0]["status"] == "proven"


@pytest.mark.serial
def test_two_scheduler_processes_and_a_restart_handle_each_of_20_slots_once(
    stack: Stack, processes: Processes, tmp_path: Path
) -> None:
    redis_port = free_port()
    prefix = f"{stack.prefix}sched"
    start_redis(processes, redis_port, tmp_path, prefix)
    env = deployment_env(stack, redis_port, prefix, "sched")
    key = create_key(env, "alpha")
    port = free_port()
    processes.spawn("sched-api", [EXECBOX, "api", "--port", str(port)], env)  # the first scheduler
    wait_until(lambda: answers_200(f"http://127.0.0.1:{port}/healthz"), 20, "the scheduling API")
    processes.spawn("sched-worker", [EXECBOX, "worker", "--name", f"{prefix}-w"], as_role(env, "worker"))
    second = processes.spawn("sched-2", [EXECBOX, "scheduler"], env)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth(key)) as client:
        name = f"ticks.t{secrets.token_hex(3)}"
        client.post("/v1/scripts", json={"name": name, "version": "1.0.0", "code": "print(1)"})
        schedule = client.post("/v1/schedules", json={"script": f"{name}@1.0.0", "cron": "* * * * * *"}).json()

        def handled(count: int) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = client.get(f"/v1/schedules/{schedule['id']}/firings").json()
            return found if len(found) >= count else []

        wait_until(lambda: handled(8), 30, "eight slots")
        os.killpg(second.pid, signal.SIGKILL)  # one scheduler dies mid-run and comes back
        processes.spawn("sched-2-again", [EXECBOX, "scheduler"], env)
        firings: Any = wait_until(lambda: handled(20), 40, "twenty slots")
        client.post(f"/v1/schedules/{schedule['id']}/pause")

    slots = [f["slot"] for f in firings]
    assert len(slots) == len(set(slots)), "no slot handled twice"
    assert slots == [slots[0] + i for i in range(len(slots))], "no slot missed"
    assert {f["status"] for f in firings} <= {"fired", "skipped_overlap"}
    fired = [f["execution_id"] for f in firings if f["status"] == "fired"]
    harness = redis.Redis.from_url(role_url(f"redis://127.0.0.1:{redis_port}/0", "harness", PASSWORDS["harness"]))
    raws: Any = harness.mget(list(harness.scan_iter(match=f"{prefix}:exe:*")))
    made = [json.loads(r)["id"] for r in raws if (json.loads(r)["origin"] or {}).get("schedule") == schedule["id"]]
    assert sorted(made) == sorted(fired) and len(fired) == len(set(fired)), "one execution per fired slot"
