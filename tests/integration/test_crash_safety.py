"""Killing the API and then Redis mid-load loses no accepted execution (real processes, AOF)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from execbox.redis_roles import role_url
from tests.conftest import (
    EXECBOX,
    PASSWORDS,
    Processes,
    Stack,
    answers_200,
    as_role,
    auth,
    create_key,
    free_port,
    wait_until,
    write_acl,
)  # fmt: skip

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.slow]


def start_redis(processes: Processes, port: int, data: Path, prefix: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed: run scripts/install"
    acl = write_acl(data / "users.acl", prefix)  # the same roles as the session's Redis
    proc = processes.spawn(f"redis-{port}", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                                             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                                             "--aclfile", str(acl)],
                           {"PATH": os.environ["PATH"]})  # fmt: skip

    def answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}", timeout=0.2) is not None
        except httpx.HTTPError as exc:  # Redis answers HTTP with a protocol error: it is up
            return "Connection refused" not in str(exc)

    wait_until(answers, 10, "the crash-test Redis to answer")
    return proc


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
    env = {
        **stack.env,
        "EXECBOX_REDIS__URL": role_url(f"redis://127.0.0.1:{redis_port}/0", "api", PASSWORDS["api"]),
        "EXECBOX_QUEUE__NAME": "crash",
        "EXECBOX_REDIS__KEY_PREFIX": prefix,
        "EXECBOX_DOCKER__URL": "unix:///var/run/docker.sock",
    }  # another deployment: not the session's docker proxy
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
    os.killpg(redis_proc.pid, signal.SIGKILL)  # and then Redis, mid-load
    redis_proc.wait(10)
    start_redis(processes, redis_port, tmp_path, prefix)  # same data directory: the AOF is replayed
    with httpx.Client(base_url=url, timeout=60, headers=auth(key)) as client:
        finals = [client.get(f"/v1/executions/{i}?wait=60").json() for i in ids]
    assert len(finals) == 12 and all("status" in f for f in finals), finals
    assert {f["status"] for f in finals} <= {"succeeded", "failed"}, [f.get("detail", f["status"]) for f in finals]
    for final in finals:
        if final["status"] == "failed":  # a run whose result could not be stored says so
            assert final["error"]["category"] == "sandbox.error" and final["error"]["retryable"], final["error"]
    assert sum(f["status"] == "succeeded" for f in finals) >= 8
