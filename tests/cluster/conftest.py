"""The three-node Swarm that `make cluster-test` starts (scripts/cluster up + deploy) and removes.

Each node is a Docker engine of its own in a network namespace (10.239.0.1N); the stack is
deploy/swarm/stack.yml. These helpers reach a node's engine, the API replicas and the admin role.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / ".run" / "cluster"
NODES = ("n1", "n2", "n3")
CLUSTER_ROOT = Path(os.environ.get("EXECBOX_CLUSTER_ROOT", "/var/tmp/ebxcl"))


def address(node: str) -> str:
    return f"10.239.0.1{node[1:]}"


def docker(node: str, *args: str, check: bool = True, timeout: float = 60) -> str:
    """The docker CLI against one node's engine."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{CLUSTER_ROOT / node / 'docker.sock'}"}
    done = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} on {node}: {done.stderr.strip()}")
    return done.stdout


def service_tasks(service: str, manager: str = "n1") -> list[tuple[str, str, str]]:
    """(node, desired state, current state) of each task of a stack service."""
    out = docker(manager, "service", "ps", f"execbox_{service}", "--no-trunc",
                 "--format", "{{.Node}}\t{{.DesiredState}}\t{{.CurrentState}}")  # fmt: skip
    return [tuple(line.split("\t")[:3]) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def running_on(service: str, manager: str = "n1") -> list[str]:
    return sorted(node for node, desired, current in service_tasks(service, manager)
                  if desired == "Running" and current.startswith("Running"))  # fmt: skip


def container_of(node: str, service: str) -> str:
    ids = docker(node, "ps", "-q", "--filter", f"label=com.docker.swarm.service.name=execbox_{service}").split()
    assert ids, f"no running task of {service} on {node}"
    return ids[0]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.5) -> Any:
    """Poll what the cluster gives no event for (a task starting on another node, a replica)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (httpx.HTTPError, AssertionError, subprocess.TimeoutExpired) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


class Api:
    """One API replica, with the tenant key scripts/cluster deploy issued."""

    def __init__(self, node: str, key: str) -> None:
        self.node = node
        self.http = httpx.Client(base_url=f"http://{address(node)}:8000", timeout=90,
                                 headers={"Authorization": f"Bearer {key}"})  # fmt: skip

    def submit(self, code: str, **body: Any) -> str:
        answer = self.http.post("/v1/executions", json={"language": "python", "code": code, **body})
        assert answer.status_code in (200, 201, 202), answer.text
        return str(answer.json()["id"])

    def result(self, execution_id: str, wait_s: int = 60) -> dict[str, Any]:
        deadline = time.monotonic() + wait_s
        while True:
            body: dict[str, Any] = self.http.get(f"/v1/executions/{execution_id}", params={"wait": 20}).json()
            if body["status"] not in ("queued", "running") or time.monotonic() > deadline:
                return body

    def record(self, execution_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/executions/{execution_id}/record")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


def node_of(record: dict[str, Any]) -> str:
    """The node an execution ran on: the record's node, else its worker's host name (worker-nN...)."""
    if record.get("node"):
        return str(record["node"])
    worker = str(record["worker"])
    return worker.split(".")[0].removeprefix("worker-")


@pytest.fixture(scope="session")
def key() -> str:
    path = RUN / "api-key"
    if not path.is_file() or not path.read_text().strip():
        pytest.fail("no cluster API key: run `make cluster-test` (scripts/cluster up && scripts/cluster deploy)")
    return path.read_text().strip()


@pytest.fixture(scope="session")
def apis(key: str) -> Iterator[dict[str, Api]]:
    """The API replicas that answer /readyz, by node."""
    found = {}
    for node in NODES:
        try:
            ready = httpx.get(f"http://{address(node)}:8000/readyz", timeout=3).status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            found[node] = Api(node, key)
    if not found:
        pytest.fail("no API replica answers on 10.239.0.11-13:8000: run `make cluster-test`")
    yield found
    for api in found.values():
        api.http.close()


def stack_env() -> dict[str, str]:
    """The passwords scripts/cluster deploy rendered (.run/cluster/stack.env)."""
    return dict(line.split("=", 1) for line in (RUN / "stack.env").read_text().splitlines() if "=" in line)


def admin(*args: str) -> str:
    """An execbox CLI command with the admin role, from a one-off container on the stack's network."""
    env = stack_env()
    url = (f"sentinel://admin:{env['REDIS_ADMIN_PASSWORD']}@sentinel-1:26379,sentinel-2:26379,"
           "sentinel-3:26379/execbox?db=0")  # fmt: skip
    return docker("n1", "run", "--rm", "--network", "execbox_backend", "--read-only", "--cap-drop", "ALL",
                  "--user", "10001:10001", "-e", f"EXECBOX_REDIS__URL={url}",
                  "execbox/service:latest", "execbox", *args)  # fmt: skip
