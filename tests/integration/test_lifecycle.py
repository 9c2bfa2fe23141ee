"""Lifecycle against real processes: cancel, expiry, lost workers, service faults, traces."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any

import docker
import httpx
import pytest

from execbox.sandbox.runtime import EXECUTION_LABEL, MANAGED_LABEL, TRACE_LABEL, UID_LABEL
from tests.conftest import ROOT, Side, Stack, run_code, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


def submit(client: httpx.Client, code: str = SLEEPER, **extra: object) -> dict[str, Any]:
    response = client.post("/v1/executions", json={"language": "python", "code": code, **extra})
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "queued"
    return body


def status_of(client: httpx.Client, execution_id: str) -> str:
    return str(client.get(f"/v1/executions/{execution_id}").json()["status"])


def container_of(docker_client: docker.DockerClient, execution_id: str) -> list[dict[str, Any]]:
    """Ids of the execution's containers (the low-level list does not inspect, so it cannot race a removal)."""
    found: list[dict[str, Any]] = docker_client.api.containers(
        all=True, filters={"label": f"{EXECUTION_LABEL}={execution_id}"}
    )
    return found


def test_cancel_running_execution_kills_its_sandbox(api: httpx.Client, docker_client: docker.DockerClient) -> None:
    body = submit(api)
    wait_until(lambda: status_of(api, body["id"]) == "running", 30, "the execution to start")
    wait_until(lambda: container_of(docker_client, body["id"]), 10, "its container")
    response = api.post(f"/v1/executions/{body['id']}/cancel")
    assert response.status_code == 202
    final = api.get(f"/v1/executions/{body['id']}?wait=30").json()
    assert final["status"] == "cancelled"
    assert final["error"]["category"] == "cancelled" and final["error"]["retryable"] is False
    assert final["timing"]["run_ms"] < 30000
    assert api.post(f"/v1/executions/{body['id']}/cancel").status_code == 409
    wait_until(lambda: container_of(docker_client, body["id"]) == [], 10, "its container to be removed")


def test_sandbox_container_is_hardened(api: httpx.Client, docker_client: docker.DockerClient) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    response = api.post(
        "/v1/executions", json={"language": "python", "code": SLEEPER}, headers={"traceparent": traceparent}
    )
    body = response.json()
    assert body["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert response.headers["x-trace-id"] == body["trace_id"]
    assert response.headers["traceparent"].startswith(f"00-{body['trace_id']}-")
    found = wait_until(lambda: container_of(docker_client, body["id"]), 30, "the sandbox container")
    attrs = docker_client.api.inspect_container(found[0]["Id"])  # type: ignore[index]
    host, config = attrs["HostConfig"], attrs["Config"]
    try:
        assert config["Labels"][MANAGED_LABEL] == "true"
        assert config["Labels"][TRACE_LABEL] == body["trace_id"]
        uid = config["Labels"][UID_LABEL]
        assert config["User"] == f"{uid}:{uid}" and 200000 <= int(uid) <= 299999  # its own uid
        assert host["ReadonlyRootfs"] is True
        assert host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert host["SecurityOpt"][0] == "no-new-privileges" and len(host["SecurityOpt"]) == 2
        profile = json.loads(host["SecurityOpt"][1].removeprefix("seccomp="))  # execbox's, not the engine's
        assert profile["syscalls"] == json.loads((ROOT / "policies" / "seccomp.json").read_text())["syscalls"]
        assert host["CgroupnsMode"] == "private" and host["OomScoreAdj"] == 1000
        assert "/proc/interrupts" in host["MaskedPaths"] and "/proc/kcore" in host["MaskedPaths"]
        assert host["Privileged"] is False and not host.get("Init")  # the launcher is PID 1 and reaps
        assert config["Cmd"][:4] == ["/usr/bin/python3-launcher", "-I", "-S", "/opt/execbox/launch.py"]
        assert host["Memory"] == host["MemorySwap"] == 256 * 1024 * 1024
        assert host["PidsLimit"] == 64 + 1 and host["CpuQuota"] == host["CpuPeriod"] == 100_000  # + the launcher
        assert set(host["Tmpfs"]) == {"/tmp"} and "size=64m" in host["Tmpfs"]["/tmp"]
        (workspace,) = host["Mounts"]  # a size-capped tmpfs volume of its own, no host path
        assert workspace["Target"] == "/workspace" and workspace["Type"] == "volume" and not workspace.get("Source")
        assert workspace["VolumeOptions"]["DriverConfig"]["Options"]["type"] == "tmpfs"
        assert "size=64m" in workspace["VolumeOptions"]["DriverConfig"]["Options"]["o"]
        (volume,) = [m["Name"] for m in attrs["Mounts"] if m["Destination"] == "/workspace"]
        assert docker_client.api.inspect_volume(volume)["Labels"][MANAGED_LABEL] == "true"  # found if left behind
        assert not host["Binds"]
        assert host["LogConfig"]["Type"] == "none"
        limits = {u["Name"]: u["Hard"] for u in host["Ulimits"]}
        assert limits["nofile"] == 1024 and limits["core"] == 0 and limits["fsize"] == 64 << 20
        assert "DOCKER_HOST" not in " ".join(config["Env"]) and "REDIS" not in " ".join(config["Env"])
    finally:
        api.post(f"/v1/executions/{body['id']}/cancel")
    assert api.get(f"/v1/executions/{body['id']}?wait=30").json()["status"] == "cancelled"
    # The workspace goes with its container.
    wait_until(lambda: not docker_client.volumes.list(filters={"name": volume}), 30, "the workspace volume removed")


def test_trace_and_execution_ids_in_worker_json_logs(api: httpx.Client, stack: Stack) -> None:
    body = run_code(api, "print('traced')")

    def logged() -> list[dict[str, Any]]:  # the worker logs "execution finished" just after it published the result
        lines = [json.loads(line) for name in ("worker-1.log", "worker-2.log")
                 for line in (stack.logs / name).read_text().splitlines() if body["id"] in line]  # fmt: skip
        return lines if any(entry["message"] == "execution finished" for entry in lines) else []

    lines = wait_until(logged, 10, "the worker's log line of the finished execution")
    assert isinstance(lines, list)
    assert all(entry["execution_id"] == body["id"] for entry in lines)
    ours = [entry for entry in lines if entry["logger"].startswith("execbox.")]
    assert ours and all(entry["trace_id"] == body["trace_id"] for entry in ours)
    assert any(entry["message"] == "execution finished" for entry in ours)


def test_cancel_queued_execution(side_stack: Callable[..., Side]) -> None:
    side = side_stack()
    with side.client() as client:
        body = submit(client)
        response = client.post(f"/v1/executions/{body['id']}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
        side.worker("late-worker")  # a worker that starts afterwards must not run it
        # One worker takes tickets in order: once a later execution has run, the cancelled one's
        # ticket has been taken (and skipped) before it.
        later = run_code(client, "print('after')", wait=60)
        assert later["status"] == "succeeded" and later["worker"].endswith("late-worker")
        final = client.get(f"/v1/executions/{body['id']}").json()
        assert final["status"] == "cancelled" and final["started_at"] is None and final["attempt"] == 0


def test_queue_deadline_expires_execution(side_stack: Callable[..., Side]) -> None:
    side = side_stack()
    with side.client() as client:
        body = submit(client, policy={"queue_timeout_s": 1})
        final = client.get(f"/v1/executions/{body['id']}?wait=10").json()
        assert final["status"] == "expired"
        assert final["error"]["category"] == "expired" and final["error"]["retryable"] is True
        assert final["started_at"] is None


def test_missing_image_is_retryable_sandbox_error(side_stack: Callable[..., Side], tmp_path: os.PathLike[str]) -> None:
    images = os.path.join(tmp_path, "images")
    os.makedirs(os.path.join(images, "python"))
    with open(os.path.join(images, "python", "metadata.yaml"), "w") as f:  # a sandbox image's name (the docker
        f.write(  # proxy inspects no other), which the engine does not hold
            "language: python\nversion: '3'\nimage: execbox/sandbox-no-such-image:none\nfile: main.py\n"
            "command: [python3, main.py]\nsmoke: [python3, -c, 'print(1)']\n"
        )
    side = side_stack(EXECBOX_IMAGES_DIR=images)
    side.worker("worker-noimage")
    with side.client() as client:
        final = run_code(client, "print(1)")
    assert final["status"] == "failed"
    assert final["error"]["category"] == "sandbox.error" and final["error"]["retryable"] is True
    assert final["error"]["details"]["code"] == "sandbox.image_unavailable"


def test_unreachable_engine_is_retryable_sandbox_error(side_stack: Callable[..., Side]) -> None:
    side = side_stack()
    side.worker("worker-nodocker", EXECBOX_DOCKER__URL="unix:///nonexistent/docker.sock")
    with side.client() as client:
        final = run_code(client, "print(1)", wait=30)
    assert final["status"] == "failed"
    assert final["error"]["category"] == "sandbox.error" and final["error"]["retryable"] is True
    assert final["error"]["details"]["code"] == "sandbox.runtime_unavailable"


def test_worker_killed_mid_run_ends_as_sandbox_error_and_leaves_no_container(
    side_stack: Callable[..., Side], docker_client: docker.DockerClient
) -> None:
    side = side_stack()
    worker = side.worker("worker-doomed")
    with side.client() as client:
        body = submit(client)
        wait_until(lambda: container_of(docker_client, body["id"]), 30, "the sandbox container to exist")
        assert status_of(client, body["id"]) == "running"
        os.killpg(worker.pid, signal.SIGKILL)
        final = client.get(f"/v1/executions/{body['id']}?wait=30").json()
        assert final["status"] == "failed", final
        assert final["error"]["category"] == "sandbox.error" and final["error"]["retryable"] is True
        assert final["error"]["details"]["reason"] == "worker_lost"
    # The session's other workers reap the orphan (their reaper runs every second here).
    wait_until(lambda: not container_of(docker_client, body["id"]), 30, "the orphaned container to be reaped")


def test_records_survive_an_api_restart(api: httpx.Client, side_stack: Callable[..., Side]) -> None:
    body = run_code(api, "print('kept')")
    side = side_stack()  # a new API process over the same Redis
    with side.client() as client:
        again = client.get(f"/v1/executions/{body['id']}").json()
    assert again["stdout"] == "kept\n" and again["status"] == "succeeded"


def test_readyz_reports_dependencies(api: httpx.Client) -> None:
    ready = api.get("/readyz")
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["redis"]["ok"] and checks["docker"]["ok"] and checks["workers"]["alive"] >= 2
    assert api.get("/healthz").json() == {"status": "ok"}


def test_no_sandbox_container_left_after_suite(docker_client: docker.DockerClient, stack: Stack) -> None:
    def leftovers() -> list[str]:
        return [
            str(c["Id"])
            for c in docker_client.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
            if str((c.get("Labels") or {}).get("execbox.worker", "")).startswith(stack.prefix)
        ]

    wait_until(lambda: not leftovers(), 15, "every sandbox container of this session to be gone")
