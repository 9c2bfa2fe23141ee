"""Plans run by the real stack: every step an execution in a real sandbox, advanced from the event
stream by the API's plan executor, with real Redis under the deployment's roles."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

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


def test_a_diamond_with_a_failing_branch_finishes_the_other_one(api: httpx.Client) -> None:
    def step(step_id: str, code: str = "print(1)", *after: str) -> dict[str, Any]:
        return {"id": step_id, "run": {"code": code}, "depends_on": list(after)}

    plan = {"format": "plan/v1", "steps": [
        step("a"), step("b", "import time\ntime.sleep(1)\nprint('b')", "a"),
        step("c", "raise SystemExit(3)", "a"), step("d", "print('d')", "b", "c")]}  # fmt: skip
    run = wait_run(api, api.post("/v1/runs", json={"plan": plan}).json()["id"])

    assert run["status"] == "needs_replan"
    assert {s: v["status"] for s, v in run["steps"].items()} == {
        "a": "succeeded", "b": "succeeded", "c": "failed", "d": "upstream_failed"}  # fmt: skip
    assert run["steps"]["c"]["error"]["category"] == "code.exit_nonzero"
    assert run["steps"]["d"]["attempts"] == [], "an invalidated step never runs"


def test_an_approval_gated_step_runs_only_once_approved(api: httpx.Client) -> None:
    gated = {"id": "send", "run": {"code": "import execbox\nexecbox.emit('sent', execbox.inputs['to'])\n"},
             "args": {"to": {"$ref": "/inputs/to"}}, "effect": "write", "idempotency": {"strategy": "key"},
             "approval": {"summary": "send the report"}}  # fmt: skip
    plan = {"format": "plan/v1", "inputs": {"to": "ops@example.com"}, "steps": [gated]}
    waiting = wait_run(api, api.post("/v1/runs", json={"plan": plan}).json()["id"])
    assert waiting["status"] == "awaiting_approval" and waiting["steps"]["send"]["attempts"] == []
    approval = api.get(f"/v1/approvals/{waiting['steps']['send']['approval_id']}").json()
    assert approval["args"] == {"to": "ops@example.com"} and "execbox.emit" in approval["code"]

    api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve", "decided_by": "alice"})
    done = wait_run(api, waiting["id"])

    assert done["status"] == "succeeded" and done["steps"]["send"]["outputs"] == {"sent": "ops@example.com"}
    rejected = wait_run(api, api.post("/v1/runs", json={"plan": plan}).json()["id"])
    api.post(f"/v1/approvals/{rejected['steps']['send']['approval_id']}/decision",
             json={"decision": "reject", "reason": "not today"})  # fmt: skip
    replan = wait_run(api, rejected["id"])
    assert replan["status"] == "needs_replan" and replan["steps"]["send"]["attempts"] == []
    assert replan["steps"]["send"]["error"] == {"category": "approval.rejected", "message": "not today",
                                                "retryable": False, "details": {}}  # fmt: skip


def test_an_artifact_reaches_a_later_step_without_the_client(api: httpx.Client) -> None:
    plan = {"format": "plan/v1", "steps": [
        {"id": "make", "run": {"code": "import execbox, os\nopen(os.path.join(execbox.output_dir, 'r.csv'), 'w')"
                               ".write('a,b\\n1,2\\n')\n"}},
        {"id": "read", "run": {"code": "import execbox\nexecbox.emit('text', open(execbox.inputs['csv']).read())\n"},
         "args": {"csv": {"$artifact": "/steps/make/artifacts/r.csv"}}},
    ]}  # fmt: skip
    run = wait_run(api, api.post("/v1/runs", json={"plan": plan}).json()["id"])

    assert run["status"] == "succeeded", run
    assert run["steps"]["read"]["outputs"] == {"text": "a,b\n1,2\n"}
    assert run["steps"]["read"]["args"] == {"csv": "artifacts/make/r.csv"}
