"""Killing the API and then Redis mid-load loses no accepted execution (real processes, AOF)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    EXECBOX,
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
)  # fmt: skip

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.slow]


def start_api(processes: Processes, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = processes.spawn(f"crash-api-{port}", [EXECBOX, "api", "--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{url}/healthz"), 20, "the crash-test API")
    return proc, url


def test_api_and_redis_killed_mid_load_lose_nothing(stack: Stack, processes: Processes, tmp_path: Path) -> None:
    redis_port = free_port()
    prefix = f"{stack.prefix}crash"
    redis_proc = start_redis(processes, redis_port, tmp_path, prefix)
    env = deployment_env(stack, redis_port, prefix, "crash")
    key = create_key(env, "alpha")
    api, url = start_api(processes, env)
    processes.spawn(
        "crash-worker", [EXECBOX, "worker", "--name", f"{stack.prefix}-crash-worker"], as_role(env, "worker")
    )
    code = "import time\ntime.sleep(0.3)\nprint('ok')"
    with httpx.Client(base_url=url, timeout=30, headers=auth(key)) as client:
        ids = [client.post("/v1/executions", json={"language": "python", "code": code}).json()["id"] for _ in range(8)]
    os.killpg(api.pid, signal.SIGKILL)  # the API dies with work in flight
    api, url = start_api(processes, env)
    with httpx.Client(base_url=url, timeout=30, headers=auth(key)) as client:
        ids += [client.post("/v1/executions", json={"language": "python", "code": code}).json()["id"] for _ in range(4)]
        wait_until(lambda: client.get(f"/v1/executions/{ids[2]}").json()["status"] != "queued", 60, "work to start")
    killed_at = time.time()
    os.killpg(redis_proc.pid, signal.SIGKILL)  # and then Redis, mid-load
    redis_proc.wait(10)
    start_redis(processes, redis_port, tmp_path, prefix)  # same data directory: the AOF is replayed
    with httpx.Client(base_url=url, timeout=60, headers=auth(key)) as client:
        finals = [client.get(f"/v1/executions/{i}?wait=60").json() for i in ids]
    assert len(finals) == 12 and all("status" in f for f in finals), finals
    assert {f["status"] for f in finals} <= {"succeeded", "failed"}, [f.get("detail", f["status"]) for f in finals]
    failed = [f for f in finals if f["status"] == "failed"]
    for final in failed:
        # Only a run already going when Redis died may fail (its lease or result could not be
        # written), and it says so; everything queued or started afterwards runs to success.
        assert final["error"]["category"] == "sandbox.error" and final["error"]["retryable"], final["error"]
        assert final["started_at"] is not None and final["started_at"] <= killed_at, (
            final["error"],
            final["started_at"] - killed_at,
        )
    assert len(failed) <= 1, "one worker runs one execution at a time: at most one was in flight"
