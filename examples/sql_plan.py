"""Schema lookup -> (the model writes the SQL) -> validation -> execution, as one plan the service
runs, with the model's turn inside it: the planner writes the plan once, before it has seen the
schema; execbox runs the schema step and waits at the input step (`awaiting_input`) with the
tables as its context; the model writes the query from them and supplies it; the validation and
execution steps follow (each in its own sandbox, outputs passed by reference). Every model call is
reported to the run (POST /v1/runs/{id}/usage), so the run's cost is whole, per role.

- `success`: the model sees the tables, writes SQL that compiles; the run succeeds; it answers.
- `recoverable`: the model slips (a column the table does not have); the validation step's check
  fails with the schema; the run stops as `needs_replan`; the re-planner reads the hand-off and
  posts a revision with corrected SQL (the schema step is not run again); the run succeeds.
- `escalate`: the question needs refunds; at the input step the model sees the tables there are,
  none of them refunds, so it writes no query: it cancels the run and asks.

    .venv/bin/python examples/sql_plan.py
"""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from execbox_client import Client, RunPublic

from agent import Conversation, Trace, check_details, count_tokens, fill, finish_run, main

EXAMPLE = "sql_plan"
DB = "<shop.db>"
"""The uploaded database's file id in the plan the model writes; replaced by the real id when sent."""

SCHEMA = """\
import sqlite3
import execbox
db = sqlite3.connect("file:shop.db?mode=ro", uri=True)
names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
execbox.emit("tables", {t: [c[1] for c in db.execute(f"PRAGMA table_info({t})")] for t in names})
"""
VALIDATE = """\
import sqlite3
import execbox
sql = execbox.inputs["sql"]
execbox.check(sql.lstrip().upper().startswith("SELECT"), "only SELECT statements are run", sql=sql)
db = sqlite3.connect("file:shop.db?mode=ro", uri=True)
try:
    db.execute("EXPLAIN " + sql)
except sqlite3.Error as error:
    execbox.check(False, "the query does not compile against the schema", error=str(error),
                  tables=execbox.inputs["tables"])
execbox.emit("sql", sql)
"""
EXECUTE = """\
import sqlite3
import execbox
db = sqlite3.connect("file:shop.db?mode=ro", uri=True)
rows = db.execute(execbox.inputs["sql"]).fetchall()
execbox.check(rows, "the query returned no rows", sql=execbox.inputs["sql"])
execbox.emit("rows", rows)
"""

GOOD = ("SELECT c.country, ROUND(SUM(o.total), 2) AS revenue FROM orders o JOIN customers c ON c.id = o.customer_id "
        "WHERE o.placed_at LIKE '2026-%' GROUP BY c.country ORDER BY revenue DESC LIMIT 3")  # fmt: skip
QUESTIONS = {
    "success": ("Which three countries brought the most revenue in 2026?", GOOD),
    "recoverable": ("Which three countries brought the most revenue in 2026?", GOOD.replace("o.total", "o.amount")),
    "escalate": ("Which three countries had the most refunded value in 2026?",
                 "SELECT c.country, SUM(r.value) AS refunded FROM refunds r JOIN customers c ON c.id = r.customer_id "
                 "WHERE r.refunded_at LIKE '2026-%' GROUP BY c.country ORDER BY refunded DESC LIMIT 3"),
}  # fmt: skip


def database() -> bytes:
    """A small shop: customers in five countries, 600 orders over 2025 and 2026 (deterministic)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shop.db"
        db = sqlite3.connect(path)
        db.executescript(
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, country TEXT);"
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total REAL, placed_at TEXT);"
        )
        countries = ["NO", "SE", "DK", "FI", "IS"]
        db.executemany("INSERT INTO customers VALUES (?, ?, ?)",
                       [(i, f"customer {i}", countries[i % 5]) for i in range(1, 51)])  # fmt: skip
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)",
                       [(i, 1 + (i * 7) % 50, round(10 + (i * 37) % 290 + (i % 3) * 0.25, 2),
                         f"{2025 + i % 2}-{1 + i % 12:02d}-{1 + i % 28:02d}") for i in range(1, 601)])  # fmt: skip
        db.commit()
        db.close()
        return path.read_bytes()


def steps(sql: str | dict[str, str], suffix: str = "") -> list[dict[str, Any]]:
    files = [{"path": "shop.db", "file_id": DB}]
    validate = {"id": f"validate{suffix}", "run": {"code": VALIDATE}, "files": files,
                "args": {"sql": sql, "tables": {"$ref": "/steps/schema/outputs/tables"}}}  # fmt: skip
    execute = {"id": f"execute{suffix}", "run": {"code": EXECUTE}, "files": files,
               "args": {"sql": {"$ref": f"/steps/validate{suffix}/outputs/sql"}}}  # fmt: skip
    return [validate, execute]


QUERY = {"id": "query", "input": {
    "summary": "write one SQLite SELECT that answers the objective, from these tables",
    "schema": {"type": "object", "required": ["sql"], "additionalProperties": False,
               "properties": {"sql": {"type": "string", "minLength": 1}}},
    "expires_in_s": 600}, "args": {"tables": {"$ref": "/steps/schema/outputs/tables"}}}  # fmt: skip


def plan(question: str) -> dict[str, Any]:
    """The whole loop in one plan: the SQL is the input step's, written once the schema is known."""
    schema = {"id": "schema", "run": {"code": SCHEMA}, "files": [{"path": "shop.db", "file_id": DB}]}
    return {"format": "plan/v1", "objective": question, "budgets": {"max_replans": 1, "max_tokens": 20000},
            "steps": [schema, QUERY, *steps({"$ref": "/steps/query/outputs/sql"})]}  # fmt: skip


def handoff_text(handoff: Mapping[str, Any]) -> str:
    """What the planner is shown of the hand-off: completed steps' outputs, failed steps' errors."""
    completed = {s["step_id"]: s.get("outputs") for s in handoff["completed"]}
    failed = [{"step": s["step_id"], "category": s["error"]["category"], "message": s["error"]["message"],
               "details": check_details(s) or None} for s in handoff["failed"]]  # fmt: skip
    return "run needs a re-plan\n" + json.dumps({"completed": completed, "failed": failed}, sort_keys=True, indent=1)


def report(box: Client, run_id: str, talk: Conversation, role: str) -> None:
    """The model's last message as one call of `role`: everything before it in, the message out."""
    *before, said = talk.messages
    box.report_usage(run_id, {"model": "scripted", "role": role, "call_id": f"{role}-{len(talk.messages)}",
                              "input_tokens": count_tokens("".join(m["text"] for m in before)),
                              "output_tokens": count_tokens(said["text"])})  # fmt: skip


def play(box: Client, name: str, about: str) -> Trace:
    trace = Trace(EXAMPLE, name, about, Conversation())
    talk = trace.conversation
    question, sql = QUESTIONS[name]
    talk.add("system", "You answer questions about the shop's database (shop.db) by writing plan/v1 plans: "
                       "look up the schema, let the run ask you for the SQL once the tables are known "
                       "(an input step), validate it, then run it.")  # fmt: skip
    talk.add("user", question)
    file_id = box.upload_file("shop.db", database())["id"]
    talk.add("model", json.dumps(plan(question), indent=1))
    run = box.start_run({"plan": fill(plan(question), DB, file_id), "labels": {"example": EXAMPLE}})
    report(box, run["id"], talk, "planner")
    run = trace.saw("run", finish_run(box, run))
    if run["status"] == "awaiting_input":
        asked = run["steps"]["query"]
        tables = (asked.get("args") or {})["tables"]
        wait = asked.get("input")
        talk.add("tool", f"the run asks (step query): {wait.get('summary', '') if wait else ''}\n"
                         f"tables: {json.dumps(tables, sort_keys=True)}")  # fmt: skip
        if "refund" in question and not any("refund" in t for t in tables):
            text = (f"The database has no refunds: its tables are {', '.join(sorted(tables))}. I cancelled the "
                    "run rather than guess; where are refunds recorded?")  # fmt: skip
            trace.outcome = {"kind": "escalated", "to": "data team", "text": talk.add("model", text)}
            report(box, run["id"], talk, "supplier")
            box.cancel_run(run["id"])
            final = trace.saw("run", box.get_run(run["id"]))
            trace.outcome["usage"] = usage_seen(final)
            return trace
        talk.add("model", json.dumps({"sql": sql}))
        report(box, run["id"], talk, "supplier")
        run = trace.saw("run", finish_run(box, box.supply_input(run["id"], "query", {"sql": sql}, "the model")))
    if run["status"] == "needs_replan":
        handoff = box.run_handoff(run["id"])
        talk.add("tool", handoff_text(handoff))
        failed = check_details(handoff["failed"][0])
        column = failed["error"].split(": ")[-1]
        fixed = sql.replace("o.amount", "o.total")
        talk.add("model", f"{column} does not exist; orders has {failed['tables']['orders']}. Revision: the same "
                          "query on orders.total.\n" + json.dumps(steps(fixed, "2"), indent=1))  # fmt: skip
        report(box, run["id"], talk, "replanner")
        body = {"base_revision": run["revision"], "reason": f"{column} is orders.total",
                "add": fill({"steps": steps(fixed, "2")}, DB, file_id)["steps"]}  # fmt: skip
        run = trace.saw("run", finish_run(box, box.revise_run(run["id"], body)))
    if run["status"] == "succeeded":
        step = run["steps"]["execute2" if "execute2" in run["steps"] else "execute"]
        rows = (step.get("outputs") or {})["rows"]
        talk.add("tool", "rows: " + json.dumps(rows))
        text = "Top countries by 2026 revenue: " + ", ".join(f"{c} ({v:,.2f})" for c, v in rows) + "."
        trace.outcome = {"kind": "answer", "text": talk.add("model", text)}
        report(box, run["id"], talk, "joiner")
    else:
        trace.outcome = {"kind": "stopped", "text": talk.add("model", f"The run ended {run['status']}; stopping.")}
    trace.outcome["usage"] = usage_seen(box.get_run(run["id"]))
    return trace


def usage_seen(run: RunPublic) -> dict[str, Any]:
    """The run's reported model calls per role (calls and tokens), as the trace keeps them."""
    roles = (run.get("usage") or {}).get("by_role") or {}
    return {role: [u.get("calls"), u.get("input_tokens"), u.get("output_tokens")] for role, u in sorted(roles.items())}


SCENARIOS = {
    "success": lambda box: play(box, "success", "the SQL, written at the input step, compiles: one plan, one answer"),
    "recoverable": lambda box: play(
        box,
        "recoverable",
        "a wrong column: the check hands off the schema, a revision fixes the SQL, the schema step is not run again",
    ),  # fmt: skip
    "escalate": lambda box: play(
        box,
        "escalate",
        "the data is not there: seen at the input step, the run is cancelled and the question handed back",
    ),  # fmt: skip
}

if __name__ == "__main__":
    sys.exit(main(EXAMPLE, SCENARIOS))
