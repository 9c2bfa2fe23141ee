"""The many-host stack on a three-node Swarm, run and broken on purpose (issue 30).

`make cluster-test` brings the cluster up, deploys deploy/swarm/stack.yml, runs this file top to
bottom and removes everything. The tests that break something come last and put back what they
broke, except the last one, which loses a node for good. Each prints its figures (per-node counts,
fail-over time), which the CI log keeps.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import secrets
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import (
    CLUSTER_ROOT,
    NODES,
    Api,
    address,
    admin,
    container_of,
    docker,
    node_of,
    running_on,
    stack_env,
    wait_for,
)

pytestmark = [pytest.mark.cluster]

WRITE_ARTIFACT = (
    "import execbox, hashlib, os\n"
    "data = os.urandom({size})\n"
    "open(execbox.output_dir + '/blob.bin', 'wb').write(data)\n"
    "print(hashlib.sha256(data).hexdigest())\n"
)


def other(apis: dict[str, Api], than: str | None = None) -> Api:
    return next(api for node, api in sorted(apis.items()) if node != than)


def run_until_elsewhere(api: Api, code: str, avoid: str, tries: int = 30, **body: Any) -> tuple[dict[str, Any], str]:
    """Submit through `api` until one execution runs on a node other than `avoid` (the workers take
    work in turn, so a few tries suffice); its result and node."""
    seen = []
    for _ in range(tries):
        result = api.result(api.submit(code, **body))
        assert result["status"] == "succeeded", result
        node = node_of(api.record(result["id"]))
        if node != avoid:
            return result, node
        seen.append(node)
    raise AssertionError(f"{tries} executions through {api.node} all ran on {avoid}: {seen}")


def test_an_artifact_written_on_one_node_downloads_byte_identical_through_the_api_on_another(
    apis: dict[str, Api],
) -> None:
    a = other(apis)
    result, ran_on = run_until_elsewhere(a, WRITE_ARTIFACT.format(size=3 << 20), avoid=a.node)
    print(f"\nsubmitted through the API on {a.node}, ran on {ran_on}")
    assert ran_on != a.node and ran_on in NODES
    body = a.http.get(result["artifacts"][0]["url"])
    assert body.status_code == 200
    assert hashlib.sha256(body.content).hexdigest() == result["stdout"].strip()
    assert len(body.content) == 3 << 20
    # And through every other replica too: the bytes live in the object store, not on a node.
    for api in apis.values():
        again = api.http.get(result["artifacts"][0]["url"])
        assert hashlib.sha256(again.content).hexdigest() == result["stdout"].strip(), api.node


def test_an_input_file_uploaded_through_one_node_reaches_a_sandbox_on_another(apis: dict[str, Api]) -> None:
    a = other(apis)
    data = secrets.token_bytes(512 << 10)
    uploaded = a.http.post("/v1/files", files={"file": ("in.bin", data)})
    assert uploaded.status_code == 201, uploaded.text
    code = "import hashlib\nprint(hashlib.sha256(open('in.bin', 'rb').read()).hexdigest())\n"
    result, ran_on = run_until_elsewhere(
        a, code, avoid=a.node, files=[{"path": "in.bin", "file_id": uploaded.json()["id"]}]
    )
    print(f"\nuploaded through {a.node}, read by a sandbox on {ran_on}")
    assert result["stdout"].strip() == hashlib.sha256(data).hexdigest()


def test_executions_spread_over_the_nodes_under_load(apis: dict[str, Api]) -> None:
    replicas = list(apis.values())
    code = "import time\ntime.sleep(1.5)\nprint('ok')"
    with ThreadPoolExecutor(12) as pool:
        ids = list(
            pool.map(lambda i: (replicas[i % len(replicas)], replicas[i % len(replicas)].submit(code)), range(24))
        )
        results = list(pool.map(lambda pair: (pair[0], pair[0].result(pair[1], wait_s=180)), ids))
    assert all(result["status"] == "succeeded" for _, result in results), [r["status"] for _, r in results]
    per_node = Counter(node_of(api.record(result["id"])) for api, result in results)
    print(f"\nexecutions per node under load (24 submitted through {sorted(apis)}): {dict(sorted(per_node.items()))}")
    assert set(per_node) == set(NODES), per_node


def test_prometheus_scrapes_every_api_and_worker_on_every_node(apis: dict[str, Api]) -> None:
    def targets() -> dict[str, list[str]]:
        answer = httpx.get(f"http://{address('n1')}:9090/api/v1/targets", timeout=5).json()
        up: dict[str, list[str]] = {}
        for target in answer["data"]["activeTargets"]:
            if target["health"] == "up":
                up.setdefault(target["labels"]["job"], []).append(target["labels"]["instance"])
        return up

    up = wait_for(lambda: (t := targets()) and len(t.get("execbox-worker", [])) == 3
                  and len(t.get("execbox-api", [])) == len(apis) and t, 60, "every target up")  # fmt: skip
    print(f"\nPrometheus targets up: {up}")


@pytest.fixture
def upstream() -> Iterator[str]:
    """An HTTP server on the host's end of the cluster bridge: the one upstream the site policy
    allows (scripts/cluster renders it), reachable only through a node's egress proxy."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"ok {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("10.239.0.1", 18080), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "10.239.0.1:18080"
    server.shutdown()
    server.server_close()


FETCH = (
    "import json, urllib.request, urllib.error\n"
    "def get(url):\n"
    "    try:\n"
    "        with urllib.request.urlopen(url, timeout=10) as r:\n"
    "            return [r.status, r.read().decode()]\n"
    "    except urllib.error.HTTPError as e:\n"
    "        return [e.code, '']\n"
    "    except OSError as e:\n"
    "        return [0, type(e).__name__]\n"
)


def test_each_nodes_egress_proxy_lets_a_run_reach_only_its_allowlist(apis: dict[str, Api], upstream: str) -> None:
    api = other(apis)
    code = FETCH + f"print(json.dumps([get('http://{upstream}/allowed'), get('http://10.239.0.1:18081/not')]))"
    policy = {"name": "site", "network": {"mode": "allowlist", "allow": [upstream]}}
    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(lambda _: api.submit(code, policy=policy), range(6)))
    seen: Counter[str] = Counter()
    for execution_id in ids:
        result = api.result(execution_id)
        assert result["status"] == "succeeded", (result["error"], result["stderr"][-1500:])
        allowed, refused = json.loads(result["stdout"].strip().splitlines()[-1])
        assert allowed == [200, "ok /allowed"] and refused[0] == 403, (allowed, refused)
        seen[node_of(api.record(execution_id))] += 1
    print(f"\nallowlist runs reached {upstream} through the egress proxy of nodes {dict(sorted(seen.items()))}")
    assert len(seen) >= 2, seen


def test_losing_a_seaweedfs_volume_server_keeps_every_artifact_readable(apis: dict[str, Api]) -> None:
    a = other(apis)
    written = []
    for _ in range(6):
        result = a.result(a.submit(WRITE_ARTIFACT.format(size=256 << 10)))
        assert result["status"] == "succeeded", result
        written.append((result["artifacts"][0]["url"], result["stdout"].strip()))
    docker("n1", "service", "scale", "-d", "execbox_seaweedfs-volume-3=0")
    try:
        wait_for(lambda: not running_on("seaweedfs-volume-3"), 60, "volume server 3 to stop")
        for url, digest in written:
            body = a.http.get(url)
            assert body.status_code == 200, body.text
            assert hashlib.sha256(body.content).hexdigest() == digest
    finally:
        docker("n1", "service", "scale", "-d", "execbox_seaweedfs-volume-3=1")
        wait_for(lambda: running_on("seaweedfs-volume-3") == ["n3"], 90, "volume server 3 back")


def test_a_drained_node_finishes_what_it_runs_and_takes_nothing_new(apis: dict[str, Api]) -> None:
    api = other(apis)
    drained = "n2"
    long_ids: list[str] = []

    def running_on_drained() -> str | None:
        long_ids.append(api.submit("import time\ntime.sleep(8)\nprint('finished')"))
        for execution_id in long_ids:
            record = api.record(execution_id)
            if record["status"] == "running" and record.get("worker") and node_of(record) == drained:
                return execution_id
        return None

    busy = wait_for(running_on_drained, 60, f"an execution running on {drained}", step_s=0.5)
    admin("nodes", "drain", drained)
    try:
        after = [api.submit("print('after the drain')") for _ in range(6)]
        results = [api.result(i) for i in after]
        assert [r["status"] for r in results] == ["succeeded"] * len(after)
        nodes_after = Counter(node_of(api.record(r["id"])) for r in results)
        finished = api.result(busy)
        listing = admin("nodes", "list")
        print(f"\ndrained {drained} while it ran {busy}: that one ended {finished['status']}; the {len(after)} "
              f"submitted after ran on {dict(nodes_after)}\n{listing}")  # fmt: skip
        assert finished["status"] == "succeeded" and finished["stdout"] == "finished\n"
        assert drained not in nodes_after
    finally:
        admin("nodes", "undrain", drained)
    # Undrained, it takes work again.
    wait_for(lambda: node_of(api.record(api.result(api.submit("print(2)"))["id"])) == drained, 60,
             f"{drained} to take work again after the undrain", step_s=0)  # fmt: skip


KILL_REDIS_SERVER = (
    'for p in /proc/[0-9]*; do [ "$(cat $p/comm)" = redis-server ] && kill -KILL "${p#/proc/}"; done; true'
)


def sentinel(*command: str) -> list[str]:
    """A Sentinel command, asked of sentinel-1 with the peer user; its reply's words."""
    env = stack_env()
    out = docker("n1", "exec", container_of("n1", "sentinel-1"), "redis-cli", "-p", "26379", "--no-auth-warning",
                 "--user", "peer", "--pass", env["REDIS_PEER_PASSWORD"], "sentinel", *command)  # fmt: skip
    return out.split()


def sentinel_primary() -> str:
    """The Redis node the Sentinels name as primary."""
    return sentinel("get-master-addr-by-name", "execbox")[0]


def sentinel_replicas_in_sync() -> list[str]:
    """The replicas Sentinel sees up, with their link to the primary up."""
    words = sentinel("replicas", "execbox")
    replicas: list[dict[str, str]] = []
    for key, value in zip(words[::2], words[1::2], strict=False):
        if key == "name":
            replicas.append({})
        replicas[-1][key] = value
    return sorted(r["ip"] for r in replicas if "s_down" not in r["flags"] and r.get("master-link-status") == "ok")


class SteadyLoad:
    """Submissions at a steady rate through the API replicas, each acknowledgement (202 + id) kept
    with its time, each refusal or failure counted with its time."""

    def __init__(self, apis: dict[str, Api], every_s: float = 0.25) -> None:
        self.apis = list(apis.values())
        self.every_s = every_s
        self.acknowledged: list[tuple[float, Api, str]] = []
        self.refused: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.every_s):
            api = self.apis[i % len(self.apis)]
            i += 1
            try:
                answer = api.http.post("/v1/executions", json={"language": "python", "code": f"print({i})"}, timeout=15)
            except httpx.HTTPError as exc:
                self.refused.append((time.monotonic(), type(exc).__name__))
                continue
            if answer.status_code == 202:
                self.acknowledged.append((time.monotonic(), api, answer.json()["id"]))
            else:
                self.refused.append((time.monotonic(), f"{answer.status_code} {answer.text[:120]}"))

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


def containers(service: str) -> set[str]:
    return {line for node in NODES for line in docker(node, "ps", "-q", "--filter",
            f"label=com.docker.swarm.service.name=execbox_{service}", check=False).split()}  # fmt: skip


def test_killing_the_redis_primary_under_load_loses_no_acknowledged_execution(apis: dict[str, Api]) -> None:
    primary = sentinel_primary()
    node = {"redis-1": "n1", "redis-2": "n2"}[primary]
    before = {service: containers(service) for service in ("api", "worker")}
    with SteadyLoad(apis) as load:
        wait_for(lambda: len(load.acknowledged) >= 8, 30, "steady acceptances before the kill")
        killed_at = time.monotonic()
        # SIGKILL to redis-server in its container: the process dies as in a crash or an OOM kill
        # (its container, and so its name in Swarm's DNS, stays; see deploy/swarm/stack.yml).
        docker(node, "exec", container_of(node, primary), "sh", "-c", KILL_REDIS_SERVER)
        promoted = wait_for(lambda: (p := sentinel_primary()) != primary and p, 60, "Sentinel to promote the replica")
        promoted_after = time.monotonic() - killed_at
        # Acceptances resume once the promoted primary has a replica again (WAIT 1): the old
        # primary, started again by its container after 10 s, rejoins as one.
        wait_for(lambda: sum(t > killed_at + 12 for t, _, _ in load.acknowledged) >= 8, 90,
                 "steady acceptances after the fail-over")  # fmt: skip
    refused_during = [(t, what) for t, what in load.refused if t > killed_at]
    last_refusal = max((t for t, _ in refused_during), default=killed_at)
    resumed_after = min(t for t, _, _ in load.acknowledged if t > last_refusal) - killed_at
    ends: Counter[str] = Counter()
    failures = []
    for _, api, execution_id in load.acknowledged:
        result = api.result(execution_id, wait_s=120)
        ends[result["status"]] += 1
        if result["status"] != "succeeded":
            failures.append((execution_id, result["status"], result.get("error")))
    print(f"\nkilled {primary} on {node}; Sentinel named {promoted} after {promoted_after:.1f} s; acceptances "
          f"resumed {resumed_after:.1f} s after the kill; {len(refused_during)} submissions refused meanwhile "
          f"({Counter(w.split(' ')[0] for _, w in refused_during)}); acknowledged "
          f"{len(load.acknowledged)}, their ends {dict(ends)}")  # fmt: skip
    assert promoted != primary
    assert ends == Counter({"succeeded": len(load.acknowledged)}), failures
    # Recovered without a restart: the same API and worker containers run.
    assert {service: containers(service) for service in ("api", "worker")} == before
    # The old primary came back (its container started it again) as the new primary's replica.
    wait_for(lambda: sentinel_replicas_in_sync() == [primary], 60, f"{primary} to rejoin as a replica")


@pytest.fixture
def survivors(key: str) -> Iterator[dict[str, Api]]:
    """Clients of the API replicas on the nodes that stay (their own: the session's may point at a
    node the earlier tests changed), closed after the test."""
    replicas = {node: Api(node, key) for node in running_on("api") if node != "n3"}
    yield replicas
    for api in replicas.values():
        api.http.close()


def test_losing_a_node_ends_its_executions_retryable_and_the_rest_carry_on(survivors: dict[str, Api]) -> None:
    # n3 holds neither a Redis node nor SeaweedFS's master, and one API replica (the stack spreads
    # the replicas over zones, n3 being a zone of its own), which Swarm must move.
    lost = "n3"
    api_before = running_on("api")
    assert lost in api_before, api_before
    api = next(iter(survivors.values()))
    # Long runs, each submitted once the one before is taken, until one runs on the node to lose:
    # one worker per node, each busy with its own, so at most one per node (a run submitted before
    # the one before it was taken could wait behind them all and never be taken). Then a queue of
    # short ones behind them.
    long_ids: list[str] = []
    for _ in running_on("worker"):
        execution_id = api.submit("import time\ntime.sleep(100)", policy={"timeout_s": 120})
        long_ids.append(execution_id)
        record = wait_for(lambda: (r := api.record(execution_id)).get("worker") and r, 30, "the long run taken")  # noqa: B023
        if node_of(record) == lost:
            break
    assert any(node_of(api.record(i)) == lost for i in long_ids), f"no long run reached {lost}"
    on_lost = [i for i in long_ids if node_of(api.record(i)) == lost]
    queued = [api.submit("print('after')") for _ in range(6)]
    lost_at = time.monotonic()
    subprocess.run(["ip", "link", "set", f"ebxc-{lost}", "down"], check=True)
    pid = int((CLUSTER_ROOT / lost / "dockerd.pid").read_text())
    subprocess.run(["kill", "-TERM", str(pid)], check=True)
    # The API keeps answering while the node is gone.
    for other_api in survivors.values():
        assert other_api.http.get("/v1/languages").status_code == 200
    ended = {i: api.result(i, wait_s=120) for i in on_lost}
    took = time.monotonic() - lost_at
    for result in ended.values():
        assert result["status"] == "failed", result
        assert result["error"]["category"] == "sandbox.error" and result["error"]["retryable"] is True, result
    print(f"\nlost {lost} running {len(on_lost)} execution(s): each ended sandbox.error, retryable, "
          f"within {took:.1f} s "
          f"(lease 10 s + reaper pass 15 s); API replicas before: {api_before}")  # fmt: skip
    # The survivors' long runs hold their workers (one run each): cancelled, they free them for the
    # queue, which would otherwise wait out their 100 s.
    for i in long_ids:
        if i not in on_lost:
            api.http.post(f"/v1/executions/{i}/cancel")
    after = [api.result(i, wait_s=120) for i in queued]
    assert [r["status"] for r in after] == ["succeeded"] * len(queued)
    assert all(node_of(api.record(r["id"])) != lost for r in after)
    # Every acknowledged execution reached an end: nothing accepted was lost.
    ends = Counter(api.result(i, wait_s=60)["status"] for i in long_ids + queued)
    assert sum(ends.values()) == len(long_ids) + len(queued) and not ends.keys() & {"queued", "running"}, ends
    # Swarm moves an API replica that ran on the lost node to a node without one.
    moved = wait_for(lambda: (now := running_on("api", "n1")) and lost not in now and len(now) == 2 and now,
                     120, "Swarm to reschedule the lost node's API replica")  # fmt: skip
    print(f"API replicas after the loss: {moved}")
