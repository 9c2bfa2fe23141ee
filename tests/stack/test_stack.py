"""Against the compose stack (`make stack-test` starts it with three workers and stops it after).

A smoke test of a few outcome categories, load spread over workers while one of them stops, and
the run records that say who ran what.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.stack]
URL = os.environ.get("EXECBOX_STACK_URL", "http://127.0.0.1:8000")
PROMETHEUS = os.environ.get("EXECBOX_PROMETHEUS_URL", "http://127.0.0.1:9090")  # started by `make up`
PROJECT = "execbox"
ROOT = Path(__file__).resolve().parents[2]
KEY_FILE = ROOT / ".run" / "api-key"  # written by `make up`


def compose_containers(service: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
         "--filter", f"label=com.docker.compose.service={service}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.split()


@pytest.fixture
def api() -> Any:
    key = os.environ.get("EXECBOX_API_KEY") or KEY_FILE.read_text().strip()
    with httpx.Client(base_url=URL, timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:
        if client.get("/readyz").status_code != 200:
            pytest.fail(f"the compose stack is not ready at {URL}: run `make stack-test` (or `make up`)")
        yield client


def run(api: httpx.Client, code: str, language: str = "python", **policy: Any) -> dict[str, Any]:
    response = api.post("/v1/executions?wait=60", json={"language": language, "code": code, "policy": policy})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_outcomes_through_the_stack(api: httpx.Client) -> None:
    ok = run(api, "import execbox\nopen(execbox.output_dir + '/r.txt', 'w').write('done')\nprint(1)")
    assert ok["status"] == "succeeded" and ok["stdout"] == "1\n"
    assert api.get(ok["artifacts"][0]["url"]).content == b"done"  # worker wrote it, the API serves it
    assert run(api, "raise ValueError('x')")["error"]["category"] == "code.exception"
    assert run(api, "import time\ntime.sleep(30)", timeout_s=1)["error"]["category"] == "limit.timeout"
    assert run(api, "b = b'x' * (200 << 20)", memory_mb=64)["error"]["category"] == "limit.memory"
    assert run(api, "echo hi >&2; exit 3", language="bash")["error"]["category"] == "code.exit_nonzero"


def test_the_service_image_serves_the_console(api: httpx.Client) -> None:
    """The templates and stylesheet are in the wheel the image installs (package data), and a key signs in."""
    key = api.headers["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=URL, timeout=30) as web:
        form = web.get("/console/signin")
        assert form.status_code == 200 and 'name="key"' in form.text
        assert "default-src 'none'" in form.headers["content-security-policy"]
        assert web.get("/console/static/console.css").headers["content-type"].startswith("text/css")
        signed = web.post("/console/signin", data={"key": key}, headers={"Origin": URL})
        assert signed.status_code == 303 and signed.headers["location"] == "/console/approvals"
        assert "Approvals" in web.get("/console/approvals").text


def test_warm_pool_and_egress_proxy_are_up(api: httpx.Client) -> None:
    assert compose_containers("egress"), "the egress service is not running"
    health = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", "execbox-egress"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert health == "healthy"
    # Warm containers wait (one per worker): a default run takes one.
    wait_until(lambda: run(api, "print(1)")["timing"]["warm_start"], 30, "a run to start warm")
    # The default policy allows no host, so an allowlist is refused before anything runs.
    refused = api.post("/v1/executions", json={"language": "python", "code": "print(1)",
                       "policy": {"network": {"mode": "allowlist", "allow": ["pypi.org"]}}})  # fmt: skip
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "policy.network.allow.0"


def prom(expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{PROMETHEUS}/api/v1/query", params={"query": expr}, timeout=10)
    answer.raise_for_status()
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def scraped(job: str) -> set[str]:
    """The job's targets that service discovery finds now and whose last scrape succeeded (the
    targets API, not `up`: series of a previous stack's targets stay queryable for 5 minutes)."""
    answer = httpx.get(f"{PROMETHEUS}/api/v1/targets", params={"state": "active"}, timeout=10)
    answer.raise_for_status()
    targets = answer.json()["data"]["activeTargets"]
    return {t["labels"]["instance"] for t in targets if t["labels"]["job"] == job and t["health"] == "up"}


def worker_addresses() -> set[str]:
    return {
        f"{network['IPAddress']}:9100"
        for container in compose_containers("worker")
        for network in inspect(container)["NetworkSettings"]["Networks"].values()
    }


def test_prometheus_scrapes_the_api_and_every_worker_with_the_alert_rules(api: httpx.Client) -> None:
    wait_until(lambda: scraped("execbox-worker") == worker_addresses(), 60, "Prometheus to scrape every worker")
    assert len(worker_addresses()) == 3
    assert scraped("execbox-api") == {"api:8000"}
    rules = httpx.get(f"{PROMETHEUS}/api/v1/rules", timeout=10).json()["data"]["groups"]
    loaded = {rule["name"] for group in rules for rule in group["rules"]}
    in_file = set(re.findall(r"^\s*- alert: (\S+)", (ROOT / "deploy" / "prometheus" / "rules.yml").read_text(), re.M))
    assert in_file and loaded == in_file
    # An execution's category reaches Prometheus (counted by the worker that ran it).
    syntax = 'sum(execbox_executions_total{category="code.syntax",language="python"})'
    before = sum(float(s["value"][1]) for s in prom(syntax))
    assert run(api, "def broken(:\n")["error"]["category"] == "code.syntax"
    wait_until(lambda: sum(float(s["value"][1]) for s in prom(syntax)) == before + 1, 30, "the count to move")
    # The warm-pool gauge is what the workers hold (one python sandbox each).
    wait_until(lambda: [float(s["value"][1]) for s in prom("execbox_warm_pool_size")] == [3.0], 60, "a full pool")


def test_prometheus_follows_the_worker_scale() -> None:
    """Docker's DNS names every replica of `worker`: scaling up adds a target, scaling down drops it."""
    scale = ["docker", "compose", "--project-name", PROJECT, "--env-file", str(ROOT / ".run" / "stack.env"),
             "up", "-d", "--wait", "--no-recreate", "--scale"]  # fmt: skip
    subprocess.run([*scale, "worker=4", "worker"], check=True, capture_output=True, cwd=ROOT)
    try:
        assert len(worker_addresses()) == 4
        wait_until(lambda: scraped("execbox-worker") == worker_addresses(), 60, "the fourth worker to be scraped")
    finally:
        subprocess.run([*scale, "worker=3", "worker"], check=True, capture_output=True, cwd=ROOT)
    assert len(worker_addresses()) == 3
    wait_until(lambda: scraped("execbox-worker") == worker_addresses(), 60, "the removed worker to be dropped")


def test_load_spreads_over_workers_and_a_stopped_worker_loses_nothing(api: httpx.Client) -> None:
    workers = compose_containers("worker")
    assert len(workers) == 3, "make stack-test starts three workers"
    code = "import time\ntime.sleep(0.5)\nprint('ok')"

    def submit(_: int) -> str:
        response = api.post("/v1/executions", json={"language": "python", "code": code})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        ids = list(pool.map(submit, range(60)))

    def busy_workers() -> set[str]:
        return {str(api.get(f"/v1/executions/{i}").json()["worker"]) for i in ids[:30]} - {"None"}

    # Every worker takes part of the load before one of them goes away.
    wait_until(lambda: len(busy_workers()) == 3, 60, "all three workers to take executions")
    subprocess.run(["docker", "stop", "-t", "60", workers[0]], check=True, capture_output=True)
    finals = [api.get(f"/v1/executions/{i}?wait=60").json() for i in ids]
    # A stop with a grace period is a drain: the stopped worker finishes the run it has and takes
    # no other, so every execution succeeds (none fails, not even with a retryable error).
    failed = [(f["id"], f["status"], f.get("error")) for f in finals if f["status"] != "succeeded"]
    assert failed == []
    ran_on = {api.get(f"/v1/executions/{i}/record").json()["worker"] for i in ids}
    assert len(ran_on) == 3, ran_on
    subprocess.run(["docker", "start", workers[0]], check=True, capture_output=True)
    wait_until(lambda: api.get("/readyz").json()["checks"]["workers"]["alive"] >= 3, 60, "the worker to return")


def inspect(container: str) -> Any:
    done = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)[0]


def stack_env() -> dict[str, str]:
    lines = (ROOT / ".run" / "stack.env").read_text().split()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def docker_exec(container: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=check)


def test_service_containers_are_hardened() -> None:
    """docker-bench-security 5.11 (memory), 5.13 (read-only root), 5.25/5.26 (no new privileges,
    capabilities), 5.29 (pids) and 4.1 (a non-root user), for every service of the stack."""
    for service in ("api", "redis", "egress", "worker", "docker-proxy"):
        (container,) = compose_containers(service)[:1]
        info = inspect(container)
        host, config = info["HostConfig"], info["Config"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], service
        assert "no-new-privileges:true" in host["SecurityOpt"] and not host["Privileged"], service
        assert host["ReadonlyRootfs"], service
        assert 0 < host["Memory"] == host["MemorySwap"] and host["PidsLimit"] > 0, service
        assert config["User"] and config["User"].split(":")[0] not in ("", "0", "root"), service
        holds_socket = any(m.get("Destination") == "/var/run/docker.sock" for m in info["Mounts"])
        assert holds_socket == (service == "docker-proxy"), service  # only the proxy holds the engine
    worker = inspect(compose_containers("worker")[0])
    assert worker["Config"]["User"] == "10001:10001"  # not even in the socket's group
    assert inspect(compose_containers("docker-proxy")[0])["HostConfig"]["NetworkMode"] == "none"
    # No setuid/setgid binary left in the service image (su, mount, passwd, ...).
    setuid = docker_exec(
        compose_containers("api")[0], "find", "/", "-xdev", "-type", "f", "-perm", "/6000", check=False
    )
    assert setuid.stdout == "", setuid.stdout


def test_only_the_egress_proxy_has_a_route_out_of_the_stack() -> None:
    host_ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()[0]
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(('{host_ip}', {port}), 3).close(); print('reached')"
        results = {}
        for service in ("api", "worker", "egress"):
            done = docker_exec(compose_containers(service)[0], "python3", "-c", probe, check=False)
            results[service] = done.stdout.strip() == "reached"
    assert results == {"api": False, "worker": False, "egress": True}, results


def test_each_role_gets_only_its_own_redis_rights() -> None:
    env = stack_env()
    redis = compose_containers("redis")[0]

    def cli(role: str, *argv: str) -> str:
        password = env[f"REDIS_{role.upper()}_PASSWORD"]
        done = docker_exec(redis, "redis-cli", "--no-auth-warning", "--user", role, "--pass", password, *argv)
        return done.stdout.strip()

    assert "NOPERM" in cli("egress", "SET", "execbox:exe:exe_x", "{}")
    assert "NOPERM" in cli("api", "CONFIG", "GET", "*")
    assert "NOPERM" in cli("worker", "ACL", "GETUSER", "api")
    assert "NOAUTH" in docker_exec(redis, "redis-cli", "GET", "execbox:exe:exe_x").stdout  # no credentials
    for service in ("api", "worker", "egress"):  # each service holds its own role's password only
        environment = "\n".join(inspect(compose_containers(service)[0])["Config"]["Env"])
        others = [r for r in ("API", "WORKER", "EGRESS", "ADMIN") if r.lower() != service]
        assert not any(env[f"REDIS_{r}_PASSWORD"] in environment for r in others), service


def test_secrets_are_sealed_in_redis_and_its_append_only_file() -> None:
    value = f"Bearer {os.urandom(16).hex()}"
    admin = ["docker-compose" if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode
             else "docker compose"][0].split()  # fmt: skip
    base = [*admin, "--project-name", PROJECT, "--env-file", str(ROOT / ".run" / "stack.env"), "run", "--rm", "-T"]
    subprocess.run([*base, "admin", "execbox", "secrets", "set", "--host", "sealed.example", "--header", "X-Key",
                    "--value", "-"], input=value, text=True, check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    try:
        redis = compose_containers("redis")[0]
        password = stack_env()["REDIS_ADMIN_PASSWORD"]
        stored = docker_exec(redis, "redis-cli", "--no-auth-warning", "--user", "admin", "--pass", password,
                             "HGETALL", "execbox:secret:*:sealed.example").stdout  # fmt: skip
        assert "sealed" in stored and value not in stored
        # Every write since the last rewrite is in the incremental AOF as the command itself.
        aof = subprocess.run(["docker", "exec", redis, "sh", "-c", "cat /data/appendonlydir/*.incr.aof"],
                             capture_output=True, check=True).stdout  # fmt: skip
        assert b"sealed.example" in aof and value.encode() not in aof
    finally:
        subprocess.run([*base, "admin", "execbox", "secrets", "delete", "--host", "sealed.example", "--header",
                        "X-Key"], check=True, capture_output=True, cwd=ROOT)  # fmt: skip
