"""Behaviour under load and faults: many waiting clients, crashed attempts, refused requests,
lost slots, reads that never change state."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import Redis, Side, Stack, auth, create_key, policies_with_tenants, redis_contents, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]


PROBE = """
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
with httpx.Client(timeout=10) as client:
    seen = []
    while not stop.wait(0.05):
        start = time.monotonic()
        assert client.get(sys.argv[1]).status_code == 200
        seen.append(time.monotonic() - start)
print(" ".join(f"{s:.4f}" for s in seen))
"""


@pytest.fixture
def roomy(side_stack: Callable[..., Side], tmp_path: Path) -> tuple[Side, dict[str, str]]:
    """An API on a queue of its own whose tenant `busy` may have 1,000 executions at once, and a
    tenant `trickle` allowed one per minute."""
    policies = policies_with_tenants(
        tmp_path,
        "default: {running: 64, per_minute: 600, policies: [default]}\n"
        "tenants:\n"
        # 300 queued at once reserve their output caps: 300 x 4 MiB of storage budget
        "  busy: {running: 1000, per_minute: 5000, policies: [default], storage_budget_mb: 2048}\n"
        # a tenant name no other test's quotas use: rate windows live in the one Redis all tests share
        "  trickle: {running: 10, per_minute: 1, policies: [default]}\n",
    )
    side = side_stack(EXECBOX_POLICIES_DIR=str(policies))
    return side, {tenant: create_key(side.env, tenant) for tenant in ("busy", "trickle")}


@pytest.mark.serial
def test_healthz_answers_in_tens_of_milliseconds_while_three_hundred_clients_wait(
    roomy: tuple[Side, dict[str, str]],
) -> None:
    """What the README promises: /healthz stays in tens of milliseconds (its p95 under 100 ms)
    while 300 clients wait at once (two workers, code that sleeps), and never stalls (each waiter
    used to hold one of the API's 40 threads: 45 of them made /healthz take 27 s)."""
    side, keys = roomy
    side.worker("load-1")
    side.worker("load-2")
    code = "import time\ntime.sleep(2)\nprint('ok')"

    async def scenario() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
        async with httpx.AsyncClient(base_url=side.base_url, timeout=60, limits=limits,
                                     headers=auth(keys["busy"])) as client:  # fmt: skip
            return list(await asyncio.gather(*(
                client.post("/v1/executions?wait=8", json={"language": "python", "code": code}) for _ in range(300)
            )))  # fmt: skip

    # Like an orchestrator's liveness probe: a process of its own (not competing with this test's
    # 300 clients for an interpreter), every 50 ms until told to stop.
    prober = subprocess.Popen([sys.executable, "-c", PROBE, f"{side.base_url}/healthz"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        answers = asyncio.run(scenario())
    finally:
        out, _ = prober.communicate("stop\n", timeout=30)
    probes = [float(x) for x in out.split()]
    with side.client() as client:  # what is still queued need not run after the test
        for answer in answers:
            if answer.status_code == 202:
                client.post(f"/v1/executions/{answer.json()['id']}/cancel", headers=auth(keys["busy"]))
    assert sorted({a.status_code for a in answers}) <= [200, 202], [a.text for a in answers if a.status_code > 202][:2]
    finished = [a.json() for a in answers if a.status_code == 200]
    assert finished and all(f["status"] == "succeeded" and f["stdout"] == "ok\n" for f in finished)
    ordered = sorted(probes)
    print(f"/healthz under 300 waiters: {len(ordered)} probes, p50 {ordered[len(ordered) // 2] * 1000:.0f} ms, "  # noqa: T201
          f"p95 {ordered[int(len(ordered) * 0.95)] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms")  # fmt: skip
    # Measured on the 2-core host, 5 runs idle: p50 2-3 ms, p95 9-14 ms, max 160-378 ms; 3 runs beside
    # two busy loops: p50 4-10 ms, p95 31-56 ms, max 150-425 ms. The slowest probe is the host's
    # scheduling noise, not a stall (27 s before): it is held to 2 s, the p95 to what the README says.
    p95 = ordered[int(len(ordered) * 0.95)]
    assert len(probes) > 50 and p95 < 0.1, (len(probes), p95, ordered[-5:])
    assert max(probes) < 2, ("a stall", ordered[-5:])


def test_a_crashed_first_attempt_does_not_lock_its_idempotency_key(stack: Stack, redis_server: Redis) -> None:
    """What an API killed between claiming a key and creating the execution leaves behind: a
    pending claim. A retry with the same key must create the execution within seconds."""
    from execbox.executions.idempotency import CLAIM_S
    from execbox.executions.schemas import ExecutionCreate
    from execbox.executions.submit import request_digest

    body = {"language": "python", "code": "print('once')"}
    key = f"crash-{time.time_ns()}"
    harness = redis.Redis.from_url(redis_server.url)
    claim = f"{stack.prefix}:t:idem:alpha:POST /v1/executions:{key}"
    digest = request_digest(ExecutionCreate.model_validate(body), [])
    assert harness.set(claim, json.dumps({"state": "pending", "hash": digest}), nx=True, ex=CLAIM_S)
    claimed_at = time.time()
    with stack.client() as api:
        retry = api.post("/v1/executions?wait=60", json=body, headers={"Idempotency-Key": key})
        replay = api.post("/v1/executions", json=body, headers={"Idempotency-Key": key})
    assert retry.status_code == 200 and retry.json()["stdout"] == "once\n", retry.text
    # The key is free once the dead API's claim lapses: the execution is created within seconds of
    # that (how long it then runs on a loaded host is not this test's subject).
    created_after = retry.json()["created_at"] - claimed_at
    assert created_after < CLAIM_S + 5, f"created {created_after:.1f} s after the claim (it lapses after {CLAIM_S} s)"
    assert replay.json()["id"] == retry.json()["id"] and replay.headers["idempotent-replayed"] == "true"


def test_a_refused_request_stores_nothing(roomy: tuple[Side, dict[str, str]], redis_server: Redis) -> None:
    side, keys = roomy
    harness = redis.Redis.from_url(redis_server.url)
    prefix = side.env["EXECBOX_REDIS__KEY_PREFIX"]

    def submission_state() -> tuple[int, int, bytes]:
        """Key count and memory of what a submission writes: records (counted: other tests' records
        may be rewritten by the sweeper meanwhile), files and the tenant's own quota and idempotency
        keys (counted and weighed). The session's Redis also serves other tests' background work,
        so the whole database's figures would not do."""
        records = list(harness.scan_iter(match=f"{prefix}:exe:*", count=1000))
        weighed = [k for pattern in ("file:*", "t:idem:trickle:*", "t:rate:trickle:*", "t:active:trickle") for k in
                   harness.scan_iter(match=f"{prefix}:{pattern}", count=1000)]  # fmt: skip
        memory = sum(int(harness.memory_usage(k) or 0) for k in weighed)
        return len(records) + len(weighed), memory, redis_contents(harness, f"{prefix}:file:*")

    files = [{"path": f"in/{i}.bin", "content_b64": "QUFB" * 20000} for i in range(4)]
    with side.client() as client:
        first = client.post("/v1/executions", json={"language": "python", "code": "print(1)"},
                            headers=auth(keys["trickle"]))  # fmt: skip
        assert first.status_code == 202, first.text
        before = submission_state()
        refused = [client.post("/v1/executions", json={"language": "python", "code": "print(2)", "files": files},
                               headers=auth(keys["trickle"])) for _ in range(5)]  # fmt: skip
        after = submission_state()
    assert {r.status_code for r in refused} == {429}, [r.text for r in refused]
    # The refusals stored no file or record and did not use up the window: the counter did not move.
    rate = list(harness.scan_iter(match=f"{prefix}:t:rate:trickle:*"))
    assert [int(harness.get(k) or 0) for k in rate] == [1]
    assert after == before  # same keys, same bytes (320 KB of refused files would show)


def test_a_slot_taken_by_a_dead_api_is_reclaimed(stack: Stack, redis_server: Redis) -> None:
    """An API killed between admission and create leaves a slot for an execution that never
    existed; the sweeper gives it back (only once it is older than any create could take)."""
    harness = redis.Redis.from_url(redis_server.url)
    active = f"{stack.prefix}:t:active:ghost-tenant"
    harness.zadd(active, {"exe_" + "g" * 26: time.time() - 120, "exe_" + "h" * 26: time.time()})
    wait_until(lambda: harness.zrange(active, 0, -1) == [b"exe_" + b"h" * 26], 30, "the sweeper to reclaim the slot")
    harness.delete(active)


def test_reading_an_execution_changes_nothing(roomy: tuple[Side, dict[str, str]], redis_server: Redis) -> None:
    """Expiry is the sweeper's (the main workers' reapers sweep this deployment every second here);
    GET and a waiting GET only read."""
    side, keys = roomy
    harness = redis.Redis.from_url(redis_server.url)
    with side.client() as client:
        created = client.post("/v1/executions", json={"language": "python", "code": "print(1)",
                              "policy": {"queue_timeout_s": 0.5}}, headers=auth(keys["busy"])).json()  # fmt: skip
        waited = client.get(f"/v1/executions/{created['id']}?wait=20", headers=auth(keys["busy"])).json()
        assert waited["status"] == "expired"
        key = f"{side.env['EXECBOX_REDIS__KEY_PREFIX']}:exe:{created['id']}"
        stored = harness.get(key)
        again = client.get(f"/v1/executions/{created['id']}?wait=1", headers=auth(keys["busy"])).json()
        record = client.get(f"/v1/executions/{created['id']}/record", headers=auth(keys["busy"]))
    assert harness.get(key) == stored and again == waited and record.status_code == 200
    assert [t["by"] for t in json.loads(stored or b"{}")["transitions"]] == ["api", "reaper"]
