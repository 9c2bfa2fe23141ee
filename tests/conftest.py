"""Test fixtures: a real redis-server per session, a real API and real workers as processes.

Docker and Redis tests never skip: when the engine or redis-server is missing the session fails
with a message that says how to get them (`make test` installs and starts both).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from execbox.core.redis_roles import ROLES, acl_file, role_url
from execbox.keyschema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
EXECBOX = str(Path(sys.executable).with_name("execbox"))
PREFIX = f"exbt{secrets.token_hex(3)}"
"""The session's key prefix: its Redis ACL names keys under it."""
ENGINE = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
"""The engine the session tests against: DOCKER_HOST's (.ci/run's engine of its own), else Docker's default."""
WORKER_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
"""This test process's index under pytest-xdist (0 alone): each process tests a deployment of its own."""
UID_RANGE = f"{200000 + WORKER_INDEX * 20000}-{200000 + WORKER_INDEX * 20000 + 19999}"
"""The sandbox uids of this process's deployment: two deployments on one host never share a uid (a uid's
process count and its files are host-wide, and the bubblewrap helpers each hand out uids of their own)."""
PASSWORDS = {role: secrets.token_hex(16) for role in (*ROLES, "harness")}
"""Each role's Redis password; `harness` (the tests' own inspections) may do anything."""


def write_acl(path: Path, prefix: str) -> Path:
    """The deployment's ACL for `prefix` plus the test harness's own unrestricted user."""
    harness = hashlib.sha256(PASSWORDS["harness"].encode()).hexdigest()
    path.write_text(acl_file(prefix, PASSWORDS, SCHEMA) + f"user harness on #{harness} ~* &* +@all\n")
    return path


def as_role(env: dict[str, str], role: str) -> dict[str, str]:
    """`env` with the Redis credentials of one component role (api, worker, egress, admin)."""
    return {**env, "EXECBOX_REDIS__URL": role_url(env["EXECBOX_REDIS__URL"], role, PASSWORDS[role])}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The leftover-container check must see the end state of the whole session.
    items.sort(key=lambda item: item.name == "test_no_sandbox_container_left_after_suite")


def redis_contents(client: Any, match: str = "*") -> bytes:
    """Every key name and value (read by type, never compressed) under `match`, as one blob to search."""
    readers = {b"string": client.get, b"hash": client.hgetall, b"list": lambda k: client.lrange(k, 0, -1),
               b"set": client.smembers, b"zset": lambda k: client.zrange(k, 0, -1, withscores=True)}  # fmt: skip
    return b"\n".join(k + b" " + repr(readers.get(client.type(k), lambda _: None)(k)).encode()
                       for k in client.scan_iter(match=match, count=1000))  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


POLL_S = 0.1
"""wait_until's step unless a call gives its own; the unit tier's predicates are in-process and cheap,
and it polls faster (tests/unit/conftest.py)."""


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, step_s: float | None = None) -> object:
    """Poll a condition the system offers no notification for (a process becoming ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S if step_s is None else step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The problem+json body of a refusal, checked to be one with this status and code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create_key(env: dict[str, str], tenant: str) -> str:
    """A real key, issued by the admin command (admin role) against the session's Redis."""
    done = subprocess.run([EXECBOX, "keys", "create", "--tenant", tenant], env=as_role(env, "admin"),
                          capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    return done.stdout.strip()


def answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start_redis(processes: Processes, port: int, data: Path, prefix: str) -> subprocess.Popen[bytes]:
    """A Redis of its own for another deployment (`prefix`), with the deployment's roles and AOF on."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed: run scripts/install"
    acl = write_acl(data / "users.acl", prefix)
    proc = processes.spawn(f"redis-{port}", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                                             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                                             "--aclfile", str(acl)], {"PATH": os.environ["PATH"]})  # fmt: skip
    wait_until(lambda: redis_answers(port), 10, f"the Redis on :{port} to answer")
    return proc


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # no credentials: refused, but up
    except OSError:
        return False


def policies_with_tenants(directory: Path, tenants_yaml: str) -> Path:
    """A copy of policies/ whose tenants.yaml is `tenants_yaml` (quotas for one test's tenants)."""
    policies = directory / "policies"
    shutil.copytree(ROOT / "policies", policies)
    (policies / "tenants.yaml").write_text(tenants_yaml)
    return policies


def deployment_env(stack: Stack, redis_port: int, prefix: str, queue: str) -> dict[str, str]:
    """The API's environment for another deployment on its own Redis; its workers use the engine's
    socket, since the session's docker proxy serves the session's deployment only."""
    return {**stack.env, "EXECBOX_REDIS__URL": role_url(f"redis://127.0.0.1:{redis_port}/0", "api", PASSWORDS["api"]),
            "EXECBOX_REDIS__KEY_PREFIX": prefix, "EXECBOX_QUEUE__NAME": queue,
            "EXECBOX_DOCKER__URL": ENGINE}  # fmt: skip


@dataclass
class Redis:
    url: str
    """The harness's own (unrestricted) DSN; components get their role's with `as_role`."""
    port: int


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    acl = write_acl(workdir / "users.acl", PREFIX)
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--aclfile",
            str(acl),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    wait_until(lambda: redis_answers(port), 10, "redis-server to answer")
    yield Redis(role_url(f"redis://127.0.0.1:{port}/0", "harness", PASSWORDS["harness"]), port)
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker engine answers ({exc}): run `scripts/engine` (starts dockerd) or `make test`")
    yield client
    client.close()


@dataclass
class Stack:
    """The system under test: settings shared by every process of this session."""

    env: dict[str, str]
    """The API's environment (Redis as the api role); `as_role` gives another component's."""
    base_url: str
    prefix: str
    logs: Path
    worker_metrics: list[str]
    keys: dict[str, str]
    """API keys by tenant: `alpha` (what the api fixture uses) and `beta`."""

    def client(self, tenant: str = "alpha") -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120, headers=auth(self.keys[tenant]))


class Processes:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop_all(self, grace_s: float = 15) -> None:
        """SIGTERM to every process, `grace_s` for all of them together, then SIGKILL to what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture(scope="session")
def process_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every process log of the session, whichever fixture started the process."""
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def session_processes(process_logs: Path) -> Iterator[Processes]:
    """The session's own processes (the docker proxy, the bubblewrap helper, the main stack)."""
    procs = Processes(process_logs)
    yield procs
    procs.stop_all()


@pytest.fixture(scope="module")
def module_processes(process_logs: Path) -> Iterator[Processes]:
    """Processes a module's fixture starts for the module's tests: stopped when the module ends."""
    procs = Processes(process_logs)
    yield procs
    procs.stop_all()


@pytest.fixture
def processes(process_logs: Path) -> Iterator[Processes]:
    """Processes one test starts (an extra API, a worker, a Redis): stopped when the test ends, so that
    no idle API or worker of an earlier test takes CPU from the tests after it. A test that checks how
    a process stops does so itself: what is still running here gets 5 s, then SIGKILL."""
    procs = Processes(process_logs)
    yield procs
    procs.stop_all(grace_s=5)


@pytest.fixture(scope="session")
def docker_proxy(
    docker_client: docker.DockerClient, session_processes: Processes, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The narrowed Docker socket every worker of the session uses (as in the compose stack)."""
    path = tmp_path_factory.mktemp("docker-proxy") / "docker.sock"
    args = [EXECBOX, "docker-proxy", "--listen", str(path), "--deployment", PREFIX, "--egress-container",
            f"{PREFIX}-egress"]  # fmt: skip
    session_processes.spawn("docker-proxy", args, {**os.environ, "EXECBOX_DOCKER__UID_RANGE": UID_RANGE})
    wait_until(path.exists, 10, "the docker proxy's socket")
    return f"unix://{path}"


BWRAP_IMAGES = ROOT / ".run" / "bwrap-images"
"""Sandbox images unpacked for bubblewrap, shared by the tests' helpers (execbox bwrap-helper --images)."""


@pytest.fixture(scope="session")
def bwrap_helper(
    session_processes: Processes, docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The host's bubblewrap helper (policy.runtime bwrap), on the engine itself: it reads sandbox
    images, never the session's containers. Its state is the session's; the unpacked images are
    shared by every test process and session of this checkout (the Python image takes ~20 s to
    unpack, and each process did it at once), less those of images no longer on the engine."""
    path = tmp_path_factory.mktemp("bwrap") / "bwrap.sock"
    state = tmp_path_factory.mktemp("bwrap-state")
    images = BWRAP_IMAGES
    current = {str(image.id).removeprefix("sha256:") for image in docker_client.images.list(name="execbox/sandbox-*")}
    for tree in images.glob("*"):
        if re.fullmatch(r"[0-9a-f]{64}", tree.name) and tree.name not in current:
            shutil.rmtree(tree, ignore_errors=True)
    args = [EXECBOX, "bwrap-helper", "--socket", str(path), "--engine", ENGINE, "--state", str(state),
            "--images", str(images), "--seccomp", str(ROOT / "policies" / "seccomp.json"),
            "--uids", UID_RANGE]  # fmt: skip
    session_processes.spawn("bwrap-helper", args, dict(os.environ))
    wait_until(path.exists, 10, "the bubblewrap helper's socket")
    return str(path)


@pytest.fixture(scope="session")
def stack(
    redis_server: Redis,
    docker_client: docker.DockerClient,
    docker_proxy: str,
    bwrap_helper: str,
    session_processes: Processes,
    tmp_path_factory: pytest.TempPathFactory,
) -> Stack:
    prefix = PREFIX
    # Every-second schedules keep the schedule tests short; the shipped policy's minimum is 60 s.
    shipped = (ROOT / "policies" / "tenants.yaml").read_text()
    fast_schedules = shipped.replace("default:\n", "default:\n  schedule_min_interval_s: 1\n", 1)
    env = {
        "EXECBOX_ARTIFACTS_DIR": str(tmp_path_factory.mktemp("artifacts")),
        **{k: v for k, v in os.environ.items() if not k.startswith("EXECBOX_")},
        "EXECBOX_REDIS__URL": role_url(redis_server.url, "api", PASSWORDS["api"]),
        "EXECBOX_REDIS__KEY_PREFIX": prefix,
        "EXECBOX_QUEUE__NAME": f"{prefix}-main",
        "EXECBOX_WORKER__LEASE_S": "3",
        "EXECBOX_WORKER__REAPER_INTERVAL_S": "1",
        "EXECBOX_WORKER__ORPHAN_GRACE_S": "1",
        # Every worker of the deployment consumes webhook deliveries: they all allow the test receivers.
        "EXECBOX_WEBHOOKS__ALLOW_HOSTS": '["localhost"]',
        "EXECBOX_WEBHOOKS__BACKOFF_S": "0.2",
        "EXECBOX_WEBHOOKS__CLAIM_IDLE_S": "2",
        "EXECBOX_WEBHOOKS__TIMEOUT_S": "1",
        "EXECBOX_LOG_LEVEL": "INFO",
        "EXECBOX_API__SSE_KEEPALIVE_S": "1",
        "EXECBOX_DOCKER__URL": docker_proxy,
        "EXECBOX_DOCKER__BWRAP_SOCKET": bwrap_helper,
        "EXECBOX_DOCKER__UID_RANGE": UID_RANGE,
        "EXECBOX_POLICIES_DIR": str(policies_with_tenants(tmp_path_factory.mktemp("stack"), fast_schedules)),
    }
    port = free_port()
    session_processes.spawn("api", [EXECBOX, "api", "--port", str(port)], env)
    worker_metrics = []
    for i in (1, 2):
        metrics_port = free_port()
        worker_metrics.append(f"127.0.0.1:{metrics_port}")
        worker_env = as_role({**env, "EXECBOX_TELEMETRY__WORKER_METRICS_PORT": str(metrics_port)}, "worker")
        session_processes.spawn(f"worker-{i}", [EXECBOX, "worker", "--name", f"{prefix}-worker-{i}"], worker_env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{base_url}/readyz"), 30, "the API's /readyz (Redis + a worker reaching Docker)")
    keys = {tenant: create_key(env, tenant) for tenant in ("alpha", "beta")}
    return Stack(env=env, base_url=base_url, prefix=prefix, logs=session_processes.logs, worker_metrics=worker_metrics,
                 keys=keys)  # fmt: skip


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client() as client:
        yield client


class RuntimeClient(httpx.Client):
    """A client whose executions all ask for one OCI runtime (policy.runtime)."""

    def __init__(self, runtime: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runtime = runtime

    def post(self, url: httpx.URL | str, *, json: Any = None, **kwargs: Any) -> httpx.Response:
        if isinstance(json, dict) and str(url).startswith("/v1/executions"):
            json = {**json, "policy": {**(json.get("policy") or {}), "runtime": self.runtime}}
        return super().post(url, json=json, **kwargs)


@pytest.fixture(params=["runc", "runsc", "bwrap"])
def runtime_api(stack: Stack, request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """The API under runc, gVisor and bubblewrap: the outcome and escape tests run under each."""
    with RuntimeClient(request.param, base_url=stack.base_url, timeout=120, headers=auth(stack.keys["alpha"])) as c:
        yield c


def run_code(
    client: httpx.Client,
    code: str,
    language: str = "python",
    wait: float = 60,
    env: dict[str, str] | None = None,
    **policy: object,
) -> dict[str, Any]:
    """Submit code and wait for its result through the API (a bounded server-side wait)."""
    request = {"language": language, "code": code, "env": env or {}, "policy": policy}
    response = client.post(f"/v1/executions?wait={wait}", json=request)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@dataclass
class Side:
    """An extra API (and optionally workers) on a queue of its own, for one test's conditions."""

    env: dict[str, str]
    base_url: str
    processes: Processes
    key: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120, headers=auth(self.key))

    def worker(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        full = f"{self.env['EXECBOX_QUEUE__NAME']}-{name}"  # starts with the session prefix
        return self.processes.spawn(full, [EXECBOX, "worker", "--name", full], as_role({**self.env, **env}, "worker"))


@pytest.fixture
def side_stack(stack: Stack, processes: Processes) -> Callable[..., Side]:
    """Factory: an API on a fresh queue (no worker listens until the test starts one)."""

    def make(**env: str) -> Side:
        queue = f"{stack.prefix}-{secrets.token_hex(3)}"
        side_env = {**stack.env, "EXECBOX_QUEUE__NAME": queue, **env}
        port = free_port()
        processes.spawn(f"api-{queue}", [EXECBOX, "api", "--port", str(port)], side_env)
        base_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers_200(f"{base_url}/healthz"), 20, "the side API to answer")
        return Side(side_env, base_url, processes, stack.keys["alpha"])

    return make


@pytest.fixture(scope="session", autouse=True)
def no_acl_denials(redis_server: Redis) -> Iterator[None]:
    """Every component works within its Redis role: the session ends with no denial logged (the
    tests that probe forbidden commands on purpose clear the log after themselves)."""
    import redis as redis_py

    yield
    log = redis_py.Redis.from_url(redis_server.url).acl_log(count=20)
    assert not log, [{k: e.get(k) for k in ("username", "reason", "object", "context")} for e in log]
