"""Fixtures for the integration tests that need an outside world: test servers on a network of
their own, the real egress proxy in its container, an API with workers whose policy reaches them,
and one SeaweedFS cluster for every test of the session that needs an S3 store."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import docker
import pytest
import redis
import yaml
from e2b_code_interpreter import Sandbox

from execbox.core.redis_roles import role_url
from execbox.egress import sealing
from execbox.sandbox.runtime import DEPLOYMENT_LABEL, MANAGED_LABEL
from tests.conftest import (
    EXECBOX,
    PASSWORDS,
    PREFIX,
    ROOT,
    Processes,
    Side,
    Stack,
    answers_200,
    free_port,
    wait_until,
)
from tests.integration.test_s3_artifacts import Cluster, start_cluster, stop_cluster

# A's and B's server: answers "ok <name>" and logs each request's headers (as JSON) to stdout; and
# echoes UDP datagrams on the same port.
SERVER = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(json.dumps(dict(self.headers)), flush=True)
        body = ("ok " + sys.argv[1]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
def udp_echo():
    import socket
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); sock.bind(("0.0.0.0", 8080))
    while True:
        data, peer = sock.recvfrom(512); sock.sendto(data, peer)
import threading; threading.Thread(target=udp_echo, daemon=True).start()
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H)
print("listening", flush=True)
server.serve_forever()
"""
FETCH = """
import http.client, json, os, socket, sys, time, urllib.request
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, type(e).__name__
def tunnel(host):
    proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
    conn = http.client.HTTPConnection(*proxy.split(":"), timeout=10)
    conn.set_tunnel(host, 8080)
    try:
        conn.request("GET", "/"); r = conn.getresponse(); return r.status, r.read().decode()
    except OSError as e:
        return 0, str(e)
def raw(address, kind):
    s = socket.socket(socket.AF_INET, kind); s.settimeout(1.5)
    try:
        if kind == socket.SOCK_STREAM:
            s.connect((address, 8080))
        else:
            s.sendto(b"x", (address, 8080)); s.recvfrom(16)  # A echoes: a reply means it got through
        return "reached"
    except OSError as e:  # unreachable, refused or timed out: all blocked
        return "blocked " + type(e).__name__
def resolve(name):
    try:
        return socket.getaddrinfo(name, 80)[0][4][0]
    except OSError as e:
        return type(e).__name__
"""


# The ledger: a downstream service that applies each write once per Idempotency-Key, and logs
# every write as {"key", "applied"} (applied: the first time that key was seen). GET /seen?key=K
# answers {"seen": bool} (a status read; not logged).
LEDGER = """
import http.server, json, urllib.parse
seen = set()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        key = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("key", [""])[0]
        body = json.dumps({"seen": key in seen}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Idempotency-Key") or ""
        applied = key not in seen or not key
        seen.add(key)
        print(json.dumps({"key": key, "applied": applied}), flush=True)
        body = json.dumps({"applied": applied}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args): pass
print("listening", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


@dataclass
class Targets:
    a_ip: str
    b_ip: str
    subnet: str
    gateway: str
    egress: str
    containers: list[Any]
    public_key: str
    """The egress proxy's: secrets are sealed to it."""

    def ledger(self) -> list[dict[str, Any]]:
        """Every write the ledger received: {"key", "applied"}."""
        return self.headers_seen_by("ledger")

    def headers_seen_by(self, name: str) -> list[dict[str, str]]:
        (container,) = [c for c in self.containers if c.name.endswith(f"-target-{name}")]
        return [json.loads(line) for line in container.logs().decode().splitlines() if line.startswith("{")]


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_outlives_the_session(docker_client: docker.DockerClient, session_processes: Processes) -> Iterator[None]:
    """What the reaper of a live deployment would do: the session's workers are stopped at its end,
    sometimes in the middle of a run or before a deferred removal, so their sandboxes and networks
    (every test deployment's label starts with PREFIX) are removed here; nothing is left behind."""
    yield
    session_processes.stop_all()
    managed: dict[str, Any] = {"label": f"{MANAGED_LABEL}=true"}

    def ours(labels: dict[str, str] | None) -> bool:
        return (labels or {}).get(DEPLOYMENT_LABEL, "").startswith(PREFIX)

    # A stopped worker's own removal may still be under way: a container already gone (404) or
    # being removed (409) is not an error here, and its volume goes once the engine is done with it.
    # Several at once: a session leaves dozens behind, and the engine takes ~0.5 s for each.
    def all_removed(removals: list[Callable[[], None]]) -> None:
        with ThreadPoolExecutor(8) as pool:
            for done in [pool.submit(removal) for removal in removals]:
                done.result()

    all_removed([partial(_removed, lambda c=c: c.remove(force=True, v=True))
                 for c in docker_client.containers.list(all=True, filters=managed) if ours(c.labels)])  # fmt: skip
    all_removed([partial(_removed, n.remove)
                 for n in docker_client.networks.list(filters=managed) if ours(n.attrs.get("Labels"))])  # fmt: skip
    all_removed([partial(_removed, lambda v=v: v.remove(force=True), in_use_wait_s=30)
                 for v in docker_client.volumes.list(filters=managed) if ours(v.attrs.get("Labels"))])  # fmt: skip


def _removed(remove: Any, in_use_wait_s: float = 0.0) -> None:
    """Remove a Docker object its owner may be removing at the same moment: gone (404) is done; a
    container already being removed (409) is left to that removal; a volume still held by such a
    container (409) is asked again until in_use_wait_s has passed."""
    deadline = time.monotonic() + in_use_wait_s
    while True:
        try:
            remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise
            if time.monotonic() >= deadline:
                if in_use_wait_s:
                    raise
                return
            time.sleep(0.2)


@pytest.fixture(scope="session")
def targets(
    stack: Stack, docker_client: docker.DockerClient, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Targets]:
    """Servers A and B and the egress proxy (current source mounted over the image's) on a network;
    the proxy holds its private key (readable by its uid only) and the egress role's Redis password."""
    name = f"{stack.prefix}-targets"
    keys = tmp_path_factory.mktemp("egress-key")
    keys.chmod(0o711)
    public_key = sealing.generate(keys / "egress.key")
    os.chown(keys / "egress.key", 10001, 10001)
    network = docker_client.networks.create(name, driver="bridge", labels={"execbox.test": stack.prefix})
    network.reload()
    config = network.attrs["IPAM"]["Config"][0]
    containers = []
    try:
        # The proxy reaches the test Redis through this network's gateway (the host).
        # (protected mode off: this throw-away server listens on loopback and this bridge only).
        client = redis.Redis.from_url(redis_server.url)
        client.config_set("bind", f"127.0.0.1 {config['Gateway']}")
        client.config_set("protected-mode", "no")
        for target in ("a", "b"):
            containers.append(docker_client.containers.run(
                "execbox/sandbox-python:latest", ["python3", "-c", SERVER, target], name=f"{name}-target-{target}",
                detach=True, network=name, user="65534:65534", read_only=True,
                labels={"execbox.test": stack.prefix},
            ))  # fmt: skip
            docker_client.networks.get(name).disconnect(containers[-1])
            docker_client.networks.get(name).connect(containers[-1], aliases=[f"target-{target}"])
        egress = docker_client.containers.run(
            "execbox/service:latest", ["execbox", "egress"], name=f"{stack.prefix}-egress", detach=True,
            network=name, user="10001:10001", read_only=True,
            volumes={str(ROOT / "service"): {"bind": "/src", "mode": "ro"},
                     str(keys): {"bind": "/run/execbox", "mode": "ro"}},
            environment={
                "PYTHONPATH": "/src",
                "EXECBOX_REDIS__URL": role_url(f"redis://{config['Gateway']}:{redis_server.port}/0", "egress",
                                               PASSWORDS["egress"]),
                "EXECBOX_EGRESS__PRIVATE_KEY_FILE": "/run/execbox/egress.key",
                "EXECBOX_REDIS__KEY_PREFIX": stack.prefix,
                "EXECBOX_EGRESS__ALLOW_PRIVATE_CIDRS": json.dumps([config["Subnet"]]),
                "EXECBOX_LOG_LEVEL": "INFO",
            },
            labels={"execbox.test": stack.prefix},
        )  # fmt: skip
        containers.append(egress)
        ledger = docker_client.containers.run(
            "execbox/sandbox-python:latest", ["python3", "-c", LEDGER], name=f"{name}-target-ledger", detach=True,
            network=name, user="65534:65534", read_only=True, labels={"execbox.test": stack.prefix},
        )  # fmt: skip
        containers.append(ledger)
        docker_client.networks.get(name).disconnect(ledger)
        docker_client.networks.get(name).connect(ledger, aliases=["target-ledger"])
        for c in containers:
            c.reload()
        for server in (*containers[:2], ledger):
            wait_until(lambda: b"listening" in server.logs(), 30, "a test server to listen")  # noqa: B023
        wait_until(lambda: b"egress proxy listening" in egress.logs(), 30, "the egress proxy to listen")
        ips = [c.attrs["NetworkSettings"]["Networks"][name]["IPAddress"] for c in containers[:2]]
        # Control: from a container on A's own network, A's UDP echo and HTTP answer.
        control = docker_client.containers.run("execbox/sandbox-python:latest", ["python3", "-c", FETCH + (
            f"print(raw('{ips[0]}', socket.SOCK_DGRAM), raw('{ips[0]}', socket.SOCK_STREAM))")],
            network=name, remove=True, user="65534:65534")  # fmt: skip
        assert control.split() == [b"reached", b"reached"], control
        yield Targets(ips[0], ips[1], config["Subnet"], config["Gateway"], str(egress.name), containers, public_key)
    finally:
        for c in containers:
            c.remove(force=True)
        network.remove()


@pytest.fixture(scope="module")
def netside(
    targets: Targets, stack: Stack, module_processes: Processes, tmp_path_factory: pytest.TempPathFactory
) -> Side:
    """An API and two workers whose `net` policy lets executions reach target-a and target-b."""
    policies = tmp_path_factory.mktemp("policies")
    for path in [*(ROOT / "policies").glob("*.yaml"), ROOT / "policies" / "seccomp.json"]:
        shutil.copy(path, policies / path.name)
    allow = ["target-a:8080", "target-b:8080", "target-ledger:8080"]
    (policies / "net.yaml").write_text(yaml.safe_dump({"network_allow": allow}))
    tenants = yaml.safe_load((policies / "tenants.yaml").read_text())
    tenants["default"]["policies"].append("net")
    (policies / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    queue = f"{stack.prefix}-net-{secrets.token_hex(2)}"  # a module's own: the fixture is made again per module
    env = {**stack.env, "EXECBOX_QUEUE__NAME": queue, "EXECBOX_POLICIES_DIR": str(policies),
           "EXECBOX_EGRESS__CONTAINER": targets.egress, "EXECBOX_EGRESS__PUBLIC_KEY": targets.public_key}  # fmt: skip
    port = free_port()
    module_processes.spawn(f"api-{queue}", [EXECBOX, "api", "--port", str(port)], env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{base_url}/healthz"), 20, "the network test API")
    side = Side(env, base_url, module_processes, stack.keys["alpha"])
    side.worker("net-1")
    side.worker("net-2")
    return side


@pytest.fixture
def ledger_side(netside: Side, processes: Processes) -> Side:
    """An API on a queue of its own with the network test's policies (the ledger allowed); workers are
    the test's."""
    env = {**netside.env, "EXECBOX_QUEUE__NAME": f"{netside.env['EXECBOX_QUEUE__NAME']}-{secrets.token_hex(3)}"}
    port = free_port()
    processes.spawn(f"api-{env['EXECBOX_QUEUE__NAME']}", [EXECBOX, "api", "--port", str(port)], env)
    wait_until(lambda: answers_200(f"http://127.0.0.1:{port}/healthz"), 20, "the ledger side API")
    return Side(env, f"http://127.0.0.1:{port}", processes, netside.key)


@dataclass
class Hooks:
    """A local webhook receiver (localhost is an allowed callback host in the test stack)."""

    url: str
    calls: list[tuple[dict[str, str], bytes]]
    """Every POST: its headers and body."""


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    calls: list[tuple[dict[str, str], bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            calls.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Hooks(f"http://localhost:{server.server_address[1]}/hook", calls)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real SeaweedFS cluster (scripts/seaweedfs), started once: each test keeps to a bucket or a key
    prefix of its own (starting one takes about 30 s)."""
    cluster = start_cluster(tmp_path_factory.mktemp("seaweedfs") / "cluster")
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def e2b_env(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The three variables an operator hands its agents, for tenant alpha (the E2B SDK's tests)."""
    monkeypatch.setenv("E2B_API_KEY", stack.keys["alpha"])
    monkeypatch.setenv("E2B_API_URL", f"{stack.base_url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{stack.base_url}/e2b/sandbox")
    yield stack


@pytest.fixture
def sandbox(e2b_env: Stack) -> Iterator[Sandbox]:
    """An E2B sandbox made by the unmodified SDK, killed after the test."""
    with Sandbox.create(timeout=120, metadata={"suite": "e2b"}, envs={"WHERE": "sandbox"}) as sbx:
        yield sbx
