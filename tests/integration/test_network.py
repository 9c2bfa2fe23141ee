"""Network policy end to end: real engine, real Redis, the real egress proxy in its container, and
two test servers (A and B) on a network of their own. No outside address is ever contacted."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import httpx
import pytest
import redis

from tests.conftest import (
    EXECBOX,
    Processes,
    Side,
    Stack,
    answers_200,
    as_role,
    auth,
    free_port,
    redis_contents,
    run_code,
    wait_until,
)  # fmt: skip
from tests.integration.conftest import FETCH, Targets

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def run(side: Side, code: str, allow: list[str] | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = {"name": "net", "network": {"mode": "allowlist", "allow": allow}} if allow else {}
    with side.client() as client:
        return run_code(client, code, **policy)


def results(body: dict[str, Any]) -> dict[str, Any]:
    assert body["status"] == "succeeded", (body["error"], body["stderr"][-2000:])
    parsed: dict[str, Any] = json.loads(body["stdout"].strip().splitlines()[-1])
    return parsed


def test_no_network_reaches_nothing_fast(netside: Side, targets: Targets) -> None:
    code = (
        FETCH
        + f"""
out = {{}}
for address in ("{targets.a_ip}", "{targets.gateway}", "172.17.0.1", "169.254.169.254", "1.1.1.1"):
    start = time.monotonic()
    out[address] = [raw(address, socket.SOCK_STREAM), raw(address, socket.SOCK_DGRAM), time.monotonic() - start]
out["dns"] = resolve("target-a")
print(json.dumps(out))
"""
    )
    found = results(run(netside, code))
    assert found.pop("dns") == "gaierror"
    for address, (tcp, udp, seconds) in found.items():
        assert tcp.startswith("blocked") and udp.startswith("blocked") and seconds < 1, (address, tcp, udp, seconds)


def test_allowlist_reaches_a_only_through_the_proxy(netside: Side, targets: Targets) -> None:
    code = (
        FETCH
        + f"""
print(json.dumps({{
    "http_a": get("http://target-a:8080/x"), "connect_a": tunnel("target-a"),
    "http_b": get("http://target-b:8080/"), "connect_b": tunnel("target-b"),
    "tcp_a": raw("{targets.a_ip}", socket.SOCK_STREAM), "udp_a": raw("{targets.a_ip}", socket.SOCK_DGRAM),
    "dns": resolve("target-a"), "gateway": raw("{targets.gateway}", socket.SOCK_STREAM),
    "docker0": raw("172.17.0.1", socket.SOCK_STREAM), "metadata": raw("169.254.169.254", socket.SOCK_STREAM),
}}))
"""
    )
    body = run(netside, code, allow=["target-a:8080"])
    found = results(body)
    assert found["http_a"] == [200, "ok a"] and found["connect_a"] == [200, "ok a"]
    assert found["http_b"][0] == 403 and "allowlist" in found["http_b"][1]
    assert found["connect_b"][0] == 0 and "403" in found["connect_b"][1]
    # Packets to anything but the proxy are dropped: a direct connect times out (1.5 s here).
    assert all(found[k].startswith("blocked") for k in ("tcp_a", "udp_a", "gateway", "docker0", "metadata")), found
    assert found["dns"] == "gaierror"
    denied = body["network"]["denied"]
    assert [(d["host"], d["port"]) for d in denied] == [("target-b", 8080), ("target-b", 8080)]
    assert all(d["trace_id"] == body["trace_id"] and d["at"] > 0 for d in denied)


def test_failure_after_a_refusal_is_network_denied(netside: Side) -> None:
    code = (
        FETCH
        + """
status, text = get("http://target-b:8080/")
assert status == 200, f"could not reach B: {status} {text}"
"""
    )
    body = run(netside, code, allow=["target-a:8080"])
    assert body["status"] == "failed" and body["error"]["category"] == "policy.network_denied", body["error"]
    assert body["error"]["details"]["original_category"] == "code.exception"
    assert body["network"]["denied"][0]["host"] == "target-b"


def test_concurrent_executions_get_their_own_allowlists(netside: Side) -> None:
    code = (
        FETCH
        + """
time.sleep(1.5)  # both runs hold their networks at the same time
print(json.dumps({"a": get("http://target-a:8080/")[0], "b": get("http://target-b:8080/")[0]}))
"""
    )
    with ThreadPoolExecutor(2) as pool:
        only_a, only_b = pool.map(lambda allow: run(netside, code, allow=allow), (["target-a:8080"], ["target-b:8080"]))
    assert results(only_a) == {"a": 200, "b": 403} and results(only_b) == {"a": 403, "b": 200}
    assert only_a["timing"]["run_ms"] > 1000 and abs(only_a["started_at"] - only_b["started_at"]) < 1.5


def test_secret_header_reaches_a_and_never_the_sandbox(netside: Side, targets: Targets, redis_server: Any) -> None:
    secret = f"Bearer {secrets.token_hex(16)}"
    admin = as_role(netside.env, "admin")
    subprocess.run([EXECBOX, "secrets", "set", "--host", "target-a", "--header", "Authorization", "--value", "-",
                    "--tenant", "alpha"], input=secret.encode(), env=admin, check=True)  # fmt: skip
    # Redis holds it sealed to the proxy's key: no key or value contains the plaintext.
    dump = redis_contents(redis.Redis.from_url(redis_server.url))
    assert secret.encode() not in dump and b"target-a" in dump
    mask = 0x5A
    masked = bytes(b ^ mask for b in secret.encode()).hex()  # the program never holds the secret itself
    code = (
        FETCH
        + f"""
import subprocess
status = get("http://target-a:8080/secret-check")
SCAN = '''
import os, sys
pid, masked = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
table = bytes(b ^ {mask} for b in range(256))
def hit(data):
    return masked in data.translate(table)
found = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if hit(open(f"/proc/{{p}}/environ", "rb").read()): found.append("environ " + p)
        except OSError:
            pass
for top in ("/workspace", "/tmp"):
    for root, _, files in os.walk(top):
        for f in files:
            try:
                if hit(open(os.path.join(root, f), "rb").read()): found.append(os.path.join(root, f))
            except OSError:
                pass
scanned = 0
with open(f"/proc/{{pid}}/maps") as maps, open(f"/proc/{{pid}}/mem", "rb") as mem:
    for line in maps:
        span, perms = line.split()[:2]
        if not perms.startswith("r"):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        try:
            mem.seek(start); data = mem.read(end - start)
        except (OSError, ValueError, OverflowError):
            continue
        scanned += len(data)
        if hit(data): found.append("memory " + span)
print(found, scanned)
'''
scan = subprocess.run(["python3", "-c", SCAN, str(os.getpid()), "{masked}"], capture_output=True, text=True)
print(json.dumps({{"status": status, "scan": scan.stdout.strip(), "err": scan.stderr[-500:]}}))
"""
    )
    try:
        found = results(run(netside, code, allow=["target-a:8080"]))
    finally:
        subprocess.run([EXECBOX, "secrets", "delete", "--host", "target-a", "--header", "Authorization",
                        "--tenant", "alpha"], env=admin, check=True)  # fmt: skip
    assert found["status"] == [200, "ok a"], found
    hits, scanned = found["scan"].rsplit(" ", 1)
    assert hits == "[]" and int(scanned) > 1 << 20, found  # megabytes of the program's memory, no trace
    seen = [h for h in targets.headers_seen_by("a") if h.get("Authorization") == secret]
    assert len(seen) == 1  # the header arrived at A, exactly once
    assert hashlib.sha256(secret.encode()).hexdigest() not in json.dumps(found)


def test_allowlist_outside_the_policy_is_refused(netside: Side) -> None:
    with netside.client() as client:
        refused = client.post(
            "/v1/executions",
            json={
                "language": "python",
                "code": "print(1)",
                "policy": {
                    "name": "net",
                    "network": {"mode": "allowlist", "allow": ["target-a:8080", "evil.example.com"]},
                },
            },
        )
        default = client.post("/v1/executions", json={"language": "python", "code": "print(1)", "policy": {
            "network": {"mode": "allowlist", "allow": ["target-a:8080"]}}})  # fmt: skip
        malformed = client.post("/v1/executions", json={"language": "python", "code": "print(1)", "policy": {
            "name": "net", "network": {"mode": "allowlist", "allow": ["http://x/"]}}})  # fmt: skip
    assert refused.status_code == 422 and default.status_code == 422 and malformed.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["policy.network.allow.1"]
    assert "network_allow" in refused.json()["errors"][0]["message"]
    assert any("policy.network" in e["field"] for e in malformed.json()["errors"])


def test_no_network_left_behind(netside: Side, docker_client: docker.DockerClient, stack: Stack) -> None:
    def leftovers() -> list[str]:
        found = docker_client.api.networks(filters={"label": [f"execbox.deployment={stack.prefix}"]})
        return [n["Name"] for n in found]

    wait_until(lambda: not leftovers(), 20, "every per-execution network to be removed")
    attached = docker_client.containers.get(f"{stack.prefix}-egress").attrs["NetworkSettings"]["Networks"]
    assert list(attached) == [f"{stack.prefix}-targets"]


def test_a_reused_network_slot_never_serves_the_previous_runs_rule(
    netside: Side, targets: Targets, stack: Stack, processes: Processes
) -> None:
    """One worker whose pool has a single /28 and no cool-down: the second run gets the very address
    the first run's proxy rule was stored under, at once. It must still be judged by its own rule
    (tenant beta, target-b only), never by the first run's (tenant alpha, target-a, alpha's secret)."""
    secret = f"Bearer {secrets.token_hex(16)}"
    admin = as_role(netside.env, "admin")
    subprocess.run([EXECBOX, "secrets", "set", "--host", "target-b", "--header", "Authorization", "--value", "-",
                    "--tenant", "alpha"], input=secret.encode(), env=admin, check=True)  # fmt: skip
    queue = f"{netside.env['EXECBOX_QUEUE__NAME']}-slot"
    side = Side({**netside.env, "EXECBOX_QUEUE__NAME": queue}, netside.base_url, processes, netside.key)
    port = free_port()
    side.processes.spawn(f"api-{queue}", [EXECBOX, "api", "--port", str(port)], side.env)
    side.base_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{side.base_url}/healthz"), 20, "the slot test API")
    side.worker("slot", EXECBOX_EGRESS__SUBNET_POOL="10.213.255.240/28", EXECBOX_EGRESS__SLOT_COOLDOWN_S="0")
    code = (
        FETCH
        + """
print(json.dumps({"proxy": os.environ["HTTP_PROXY"], "a": get("http://target-a:8080/slot"),
                  "b": get("http://target-b:8080/slot")}))
"""
    )
    try:
        with side.client() as alpha:
            first = results(
                run_code(alpha, code, name="net", network={"mode": "allowlist", "allow": ["target-a:8080"]})
            )
        with httpx.Client(base_url=side.base_url, timeout=120, headers=auth(stack.keys["beta"])) as beta:
            second = results(
                run_code(beta, code, name="net", network={"mode": "allowlist", "allow": ["target-b:8080"]})
            )
    finally:
        subprocess.run([EXECBOX, "secrets", "delete", "--host", "target-b", "--header", "Authorization",
                        "--tenant", "alpha"], env=admin, check=True)  # fmt: skip
    assert first["proxy"] == second["proxy"] == "http://10.213.255.242:3128"  # the same slot, reused
    assert first["a"] == [200, "ok a"] and first["b"][0] == 403
    assert second["a"][0] == 403 and second["b"] == [200, "ok b"]  # beta's own allowlist, not alpha's
    seen_by_b = targets.headers_seen_by("b")
    assert seen_by_b and all(h.get("Authorization") != secret for h in seen_by_b)  # nor alpha's secret


def test_allowlist_under_gvisor_reaches_a_only_through_the_proxy(netside: Side, targets: Targets) -> None:
    """gVisor with the run's network namespace passed through (runtime runsc-net): the same
    allowlist, the same proxy, the same dropped packets."""
    code = (
        FETCH
        + f"""
print(json.dumps({{"http_a": get("http://target-a:8080/x"), "http_b": get("http://target-b:8080/"),
                   "tcp_a": raw("{targets.a_ip}", socket.SOCK_STREAM), "kernel": os.uname().release}}))
"""
    )
    with netside.client() as client:
        body = run_code(client, code, name="net", runtime="runsc",
                        network={"mode": "allowlist", "allow": ["target-a:8080"]})  # fmt: skip
    found = results(body)
    assert found["kernel"] == "4.4.0"  # gVisor's
    assert found["http_a"] == [200, "ok a"] and found["http_b"][0] == 403 and found["tcp_a"].startswith("blocked")
    assert body["policy"]["runtime"] == "runsc"
