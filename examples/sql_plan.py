"""Schema lookup -> SQL -> validation -> execution, as a plan the service runs, with a recoverable
failure: the planner writes the whole plan once, execbox runs its steps (each in its own sandbox,
outputs passed by reference), and the conversation resumes only with the hand-off of a run that
needs a re-plan.

- `success`: the SQL compiles against the schema; the run succeeds; the joiner answers.
- `recoverable`: the SQL names a column the table does not have; the validation step's check
  fails with the schema; the run stops as `needs_replan`; the planner reads the hand-off and posts
  a revision with corrected SQL (the schema step is not run again); the run succeeds.
- `escalate`: the question needs refunds, which the database does not hold; the hand-off shows
  the tables there are; no revision can invent them, so the planner cancels the run and asks.

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

from execbox_client import Client

from agent import Conversation, Trace, check_details, fill, finish_run, main

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


def steps(sql: str, suffix: str = "") -> list[dict[str, Any]]:
    files = [{"path": "shop.db", "file_id": DB}]
    validate = {"id": f"validate{suffix}", "run": {"code": VALIDATE}, "files": files,
                "args": {"sql": sql, "tables": {"$ref": "/steps/schema/outputs/tables"}}}  # fmt: skip
    execute = {"id": f"execute{suffix}", "run": {"code": EXECUTE}, "files": files,
               "args": {"sql": {"$ref": f"/steps/validate{suffix}/outputs/sql"}}}  # fmt: skip
    return [validate, execute]


def plan(question: str, sql: str) -> dict[str, Any]:
    schema = {"id": "schema", "run": {"code": SCHEMA}, "files": [{"path": "shop.db", "file_id": DB}]}
    return {"format": "plan/v1", "objective": question, "budgets": {"max_replans": 1}, "steps": [schema, *steps(sql)]}


def handoff_text(handoff: Mapping[str, Any]) -> str:
    """What the planner is shown of the hand-off: completed steps' outputs, failed steps' errors."""
    completed = {s["step_id"]: s.get("outputs") for s in handoff["completed"]}
    failed = [{"step": s["step_id"], "category": s["error"]["category"], "message": s["error"]["message"],
               "details": check_details(s) or None} for s in handoff["failed"]]  # fmt: skip
    return "run needs a re-plan\n" + json.dumps({"completed": completed, "failed": failed}, sort_keys=True, indent=1)


def play(box: Client, name: str, about: str) -> Trace:
    trace = Trace(EXAMPLE, name, about, Conversation())
    talk = trace.conversation
    question, sql = QUESTIONS[name]
    talk.add("system", "You answer questions about the shop's database (shop.db) by writing plan/v1 plans: "
                       "look up the schema, validate the SQL, then run it.")  # fmt: skip
    talk.add("user", question)
    file_id = box.upload_file("shop.db", database())["id"]
    first = plan(question, sql)
    talk.add("model", json.dumps(first, indent=1))
    run = box.start_run({"plan": fill(first, DB, file_id), "labels": {"example": EXAMPLE}})
    run = trace.saw("run", finish_run(box, run))
    if run["status"] == "needs_replan":
        handoff = box.run_handoff(run["id"])
        talk.add("tool", handoff_text(handoff))
        failed = check_details(handoff["failed"][0])
        tables = failed["tables"]
        if "no such column" in failed["error"]:
            column = failed["error"].split(": ")[-1]
            fixed = sql.replace("o.amount", "o.total")
            talk.add("model", f"{column} does not exist; orders has {tables['orders']}. Revision: the same query "
                              "on orders.total.\n" + json.dumps(steps(fixed, "2"), indent=1))  # fmt: skip
            body = {"base_revision": run["revision"], "reason": f"{column} is orders.total",
                    "add": fill({"steps": steps(fixed, "2")}, DB, file_id)["steps"]}  # fmt: skip
            run = trace.saw("run", finish_run(box, box.revise_run(run["id"], body)))
        else:
            box.cancel_run(run["id"])
            trace.saw("run", box.get_run(run["id"]))
            text = (f"The database has no refunds: its tables are {', '.join(sorted(tables))}. I cancelled the "
                    "run rather than guess; where are refunds recorded?")  # fmt: skip
            trace.outcome = {"kind": "escalated", "to": "data team", "text": talk.add("model", text)}
            return trace
    if run["status"] == "succeeded":
        step = run["steps"]["execute2" if "execute2" in run["steps"] else "execute"]
        rows = (step.get("outputs") or {})["rows"]
        talk.add("tool", "rows: " + json.dumps(rows))
        text = "Top countries by 2026 revenue: " + ", ".join(f"{c} ({v:,.2f})" for c, v in rows) + "."
        trace.outcome = {"kind": "answer", "text": talk.add("model", text)}
    else:
        trace.outcome = {"kind": "stopped", "text": talk.add("model", f"The run ended {run['status']}; stopping.")}
    return trace


SCENARIOS = {
    "success": lambda box: play(box, "success", "the SQL compiles: one plan, one answer"),
    "recoverable": lambda box: play(
        box,
        "recoverable",
        "a wrong column: the check hands off the schema, a revision fixes the SQL, the schema step is not run again",
    ),  # fmt: skip
    "escalate": lambda box: play(
        box, "escalate", "the data is not there: the run is cancelled and the question handed back"
    ),  # fmt: skip
}

if __name__ == "__main__":
    sys.exit(main(EXAMPLE, SCENARIOS))
