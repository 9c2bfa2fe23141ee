"""Plans run by the real stack: every step an execution in a real sandbox, advanced from the event
stream by the API's plan executor, with real Redis under the deployment's roles. What stays here
is the end-to-end plan (real Python passing outputs between steps, a check stopping the run, a
revision finishing it) and the runs whose API or worker process is killed mid-step; the
orchestration (approvals, artifacts between steps, run webhooks, saved traces, budgets) runs on
the in-process stack in tests/unit/test_plans_in_process.py."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from execbox.core.redis_roles import role_url
from tests.conftest import (
    EXECBOX,
    PASSWORDS,
    Processes,
    Side,
    Stack,
    answers_200,
    as_role,
    auth,
    create_key,
    deployment_env,
    free_port,
    start_redis,
    wait_until,
)
from tests.integration.conftest import Targets

pytestmark = [pytest.mark.docker, pytest.mark.redis]

SCHEMA = """
import sqlite3, execbox
db = sqlite3.connect("file:shop.db?mode=ro", uri=True)
names = [n for (n,) in db.execute("select name from sqlite_master where type = 'table' order by name")]
execbox.emit("tables", {n: [c[1] for c in db.execute(f"pragma table_info({n})")] for n in names})
"""
CHECK = """
import re, execbox
sql, tables = execbox.inputs["sql"], execbox.inputs["tables"]
execbox.check(sql.lstrip().lower().startswith("select") and ";" not in sql, "the query is not one read-only select",
              sql=sql)
used = set(re.findall(r"(?:from|join)\\s+([a-z_][a-z0-9_]*)", sql.lower()))
execbox.check(used <= set(tables), "the query uses unknown tables", unknown=sorted(used - set(tables)))
execbox.emit("sql", sql)
"""
EXECUTE = """
import sqlite3, execbox
db = sqlite3.connect("file:shop.db?mode=ro", uri=True)
execbox.emit("rows", db.execute(execbox.inputs["sql"]).fetchall())
"""


def query_step(step_id: str, sql: str) -> dict[str, Any]:
    """Stands in for a model writing the query from the schema (a fixed cell)."""
    return {"id": step_id, "run": {"code": f"import execbox\nexecbox.emit('sql', {sql!r})\n"},
            "args": {"tables": {"$ref": "/steps/schema/outputs/tables"}}}  # fmt: skip


def check_and_execute(suffix: str, query: str, db: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [
        {"id": f"check{suffix}", "run": {"code": CHECK},
         "args": {"sql": {"$ref": f"/steps/{query}/outputs/sql"}, "tables": {"$ref": "/steps/schema/outputs/tables"}}},
        {"id": f"execute{suffix}", "run": {"code": EXECUTE}, "files": db,
         "args": {"sql": {"$ref": f"/steps/check{suffix}/outputs/sql"}}},
    ]  # fmt: skip


def wait_run(api: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = api.get(f"/v1/runs/{run_id}?wait=60").json()
    return body


def uploaded_db(api: httpx.Client, tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("create table customers (id integer primary key, name text)")
        db.execute("create table orders (id integer primary key, customer_id integer, total real)")
        db.executemany("insert into customers (name) values (?)", [("Ada",), ("Grace",)])
    file_id = api.post("/v1/files", files={"file": ("shop.db", path.read_bytes())}).json()["id"]
    return [{"path": "shop.db", "file_id": file_id}]


def test_the_schema_lookup_plan_stops_at_the_check_and_a_revision_finishes_it(
    api: httpx.Client, tmp_path: Path
) -> None:
    db = uploaded_db(api, tmp_path)
    plan = {"format": "plan/v1", "objective": "list the customers by name", "steps": [
        {"id": "schema", "run": {"code": SCHEMA}, "files": db},
        query_step("query", "select name from customer_names order by name"),
        *check_and_execute("", "query", db),
    ]}  # fmt: skip
    created = api.post("/v1/runs", json={"plan": plan})
    assert created.status_code == 201, created.text

    stopped = wait_run(api, created.json()["id"])

    assert stopped["status"] == "needs_replan", stopped
    steps = stopped["steps"]
    assert [steps[s]["status"] for s in ("schema", "query", "check", "execute")] == [
        "succeeded", "succeeded", "failed", "upstream_failed"]  # fmt: skip
    assert steps["check"]["error"]["category"] == "check.failed"
    assert steps["check"]["error"]["details"]["details"] == {"unknown": ["customer_names"]}
    handoff = api.get(f"/v1/runs/{stopped['id']}/handoff").json()
    assert [s["step_id"] for s in handoff["completed"]] == ["schema", "query"]
    assert handoff["completed"][0]["outputs"]["tables"]["customers"] == ["id", "name"]
    assert [s["step_id"] for s in handoff["invalidated"]] == ["execute"]
    assert (
        handoff["failed"][0]["side_effects"] == "none" and "unknown tables" in handoff["failed"][0]["error"]["message"]
    )

    revision = {
        "base_revision": 1,
        "reason": "the table is customers",
        "add": [
            query_step("query2", "select name from customers order by name"),
            *check_and_execute("2", "query2", db),
        ],
    }
    revised = api.post(f"/v1/runs/{stopped['id']}/revisions", json=revision)
    assert revised.status_code == 200, revised.text
    final = wait_run(api, stopped["id"])

    assert final["status"] == "succeeded", final
    assert final["steps"]["execute2"]["outputs"]["rows"] == [["Ada"], ["Grace"]]
    assert len(final["steps"]["schema"]["attempts"]) == 1, "the schema step was not run again"
    assert {final["steps"][s]["status"] for s in ("check", "execute")} == {"superseded"}
    ran = [api.get(f"/v1/executions/{e}").json() for s in final["steps"].values() for e in s["attempts"]]
    assert len(ran) == 6, "schema, query, check, then query2, check2, execute2: execute never ran"
    assert all(r["trace_id"] == final["trace_id"] for r in ran), "one trace for the whole run"


WRITE = """
import execbox, json, time, urllib.request
keyed = execbox.inputs["keyed"]
key = execbox.idempotency_key() if keyed else "unkeyed-" + execbox.context["run_id"]
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": key})
answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
if execbox.context["attempt"] == "1":
    time.sleep(120)  # the test kills this attempt's worker here, after the write
execbox.emit("applied", answer["applied"])
"""


def write_plan(strategy: str) -> dict[str, Any]:
    policy = {"name": "net", "timeout_s": 30, "network": {"mode": "allowlist", "allow": ["target-ledger:8080"]}}
    step = {
        "id": "write",
        "run": {"code": WRITE},
        "args": {"keyed": strategy == "key"},
        "effect": "write",
        "idempotency": {"strategy": strategy},
        "retry": {"max_attempts": 3, "interval_s": 0},
        "policy": policy,
    }
    return {"format": "plan/v1", "steps": [step]}


def kill_mid_write(side: Side, client: httpx.Client, targets: Targets, strategy: str) -> tuple[dict[str, Any], str]:
    """Start the write step on a worker of its own, wait until the ledger saw its write, start a
    second worker (it reaps and retries), SIGKILL the first. Returns the finished run and the key."""
    first = side.worker(f"write-{strategy}-1")
    run = client.post("/v1/runs", json={"plan": write_plan(strategy)}).json()
    key = f"{run['id']}:write" if strategy == "key" else f"unkeyed-{run['id']}"
    wait_until(lambda: any(e["key"] == key for e in targets.ledger()), 60, "the step's write to reach the ledger")
    side.worker(f"write-{strategy}-2")
    os.killpg(first.pid, signal.SIGKILL)
    return wait_run(client, run["id"]), key


def test_a_keyed_write_whose_worker_dies_is_retried_with_its_key_and_applied_once(
    ledger_side: Side, targets: Targets
) -> None:
    with ledger_side.client() as client:
        run, key = kill_mid_write(ledger_side, client, targets, "key")
        assert run["status"] == "succeeded", run
        first, second = [client.get(f"/v1/executions/{e}").json() for e in run["steps"]["write"]["attempts"]]
        assert first["error"]["category"] == "sandbox.error" and first["error"]["details"]["reason"] == "worker_lost"
        assert second["status"] == "succeeded" and run["steps"]["write"]["outputs"] == {"applied": False}
        assert [e["applied"] for e in targets.ledger() if e["key"] == key] == [True, False], "applied once"


def test_an_unkeyed_write_whose_worker_dies_waits_for_reconcile_and_is_never_retried(
    ledger_side: Side, targets: Targets
) -> None:
    with ledger_side.client() as client:
        run, key = kill_mid_write(ledger_side, client, targets, "none")
        assert run["status"] == "needs_replan", run
        step = run["steps"]["write"]
        assert step["status"] == "unknown_outcome" and step["side_effects"] == "unknown" and len(step["attempts"]) == 1
        handoff = client.get(f"/v1/runs/{run['id']}/handoff").json()
        assert [s["step_id"] for s in handoff["unknown_outcomes"]] == ["write"]
        settled = client.post(
            f"/v1/runs/{run['id']}/steps/write/reconcile",
            json={"outcome": "applied", "outputs": {"applied": True}, "reason": "the ledger has it"},
        )
        assert settled.status_code == 200 and settled.json()["status"] == "succeeded"
        assert len([e for e in targets.ledger() if e["key"] == key]) == 1, "never sent twice"


def test_killing_the_api_and_a_worker_mid_run_loses_no_step_and_runs_none_twice(
    stack: Stack, processes: Processes, tmp_path: Path
) -> None:
    redis_port = free_port()
    prefix = f"{stack.prefix}plancrash"
    start_redis(processes, redis_port, tmp_path, prefix)
    env = {**deployment_env(stack, redis_port, prefix, "plancrash"), "EXECBOX_PLANS__CLAIM_IDLE_S": "1"}
    key = create_key(env, "alpha")

    def api_process() -> tuple[subprocess.Popen[bytes], httpx.Client]:
        port = free_port()
        proc = processes.spawn(f"plancrash-api-{port}", [EXECBOX, "api", "--port", str(port)], env)
        wait_until(lambda: answers_200(f"http://127.0.0.1:{port}/healthz"), 20, "the crash-test API")
        return proc, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=90, headers=auth(key))

    def worker(name: str) -> subprocess.Popen[bytes]:
        return processes.spawn(name, [EXECBOX, "worker", "--name", f"{prefix}-{name}"], as_role(env, "worker"))

    sleeper = "import time, execbox\ntime.sleep(1.5)\nexecbox.emit('at', time.time())\n"
    steps = [{"id": "s0", "run": {"code": sleeper}}]
    steps += [{"id": f"s{i}", "run": {"code": sleeper}, "depends_on": [f"s{i - 1}"]} for i in range(1, 6)]
    steps += [{"id": "side", "run": {"code": sleeper}}]
    api, client = api_process()
    clients = [client]
    try:
        first, spare = worker("w1"), worker("w2")
        run_id = client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}}).json()["id"]
        wait_until(
            lambda: client.get(f"/v1/runs/{run_id}").json()["steps"]["s1"]["status"] == "running", 60, "s1 to start"
        )
        os.killpg(api.pid, signal.SIGKILL)  # the API dies with the run in flight
        client.close()
        api, client = api_process()
        clients.append(client)
        wait_until(
            lambda: client.get(f"/v1/runs/{run_id}").json()["steps"]["s3"]["status"] == "running", 60, "s3 to start"
        )
        running_s3 = client.get(
            f"/v1/executions/{client.get(f'/v1/runs/{run_id}').json()['steps']['s3']['attempts'][-1]}"
        )
        victim = {f"{prefix}-w1": first, f"{prefix}-w2": spare}[running_s3.json()["worker"]]
        os.killpg(victim.pid, signal.SIGKILL)  # and a worker, while it runs s3
        worker("w3")

        final = client.get(f"/v1/runs/{run_id}?wait=60").json()
    finally:
        for open_client in clients:
            open_client.close()

    assert final["status"] == "succeeded", final
    harness = redis.Redis.from_url(role_url(f"redis://127.0.0.1:{redis_port}/0", "harness", PASSWORDS["harness"]))
    raws: Any = harness.mget(list(harness.scan_iter(match=f"{prefix}:exe:*")))
    executions = [json.loads(raw) for raw in raws]
    by_step: dict[str, list[dict[str, Any]]] = {}
    for record in executions:
        by_step.setdefault(record["origin"]["step"], []).append(record)
    for step_id, state in final["steps"].items():
        made = sorted(r["id"] for r in by_step[step_id])
        assert made == sorted(state["attempts"]), f"{step_id}: every execution made is an attempt of the run's"
        assert [r["status"] for r in by_step[step_id]].count("succeeded") == 1, f"{step_id} succeeded once"
    assert {s: len(v["attempts"]) for s, v in final["steps"].items() if s != "s3"} == dict.fromkeys(
        ["s0", "s1", "s2", "s4", "s5", "side"], 1), "only the step whose worker died ran again"  # fmt: skip
    lost = [r for r in by_step["s3"] if r["status"] != "succeeded"]
    assert [r["error"]["details"].get("reason") for r in lost] == ["worker_lost"]
