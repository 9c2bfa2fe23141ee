"""Thirty subsidiaries' ledgers -> one script computes each net margin and the ranked summary.

The conversation holds a sample of one file, the script and the answer, whatever the data size:
the rows stay in the sandbox. Run after `make up`:

    .venv/bin/python examples/subsidiaries.py            # three scenarios, then the size at 2,400 and 240,000 rows
    .venv/bin/python examples/subsidiaries.py --scenario recoverable

Scenarios: `success`; `recoverable` (one subsidiary exports with semicolons: the script's check
names the file and its header, the planner writes a second script that reads both); `escalate`
(one ledger has the same quarter twice: which copy is right is not the planner's to guess, so it
hands the question to the controller).
"""

from __future__ import annotations

import gzip
import random
import sys
from collections.abc import Mapping
from typing import Any

from execbox_client import Client, ExecutionPublic

from agent import Conversation, Trace, check_details, main, outcome_of

EXAMPLE = "subsidiaries"
SUBSIDIARIES = [f"S{n:02d}" for n in range(1, 31)]
POLICY = {"timeout_s": 120, "memory_mb": 1024, "disk_mb": 512, "input_total_bytes": 104857600}

TASK = ("Here are the quarterly ledgers of our 30 subsidiaries, one gzipped CSV each under ledgers/. "
        "Compute each subsidiary's net margin over all its rows and give me the ranking.")  # fmt: skip

PEEK = """\
import gzip, os
names = sorted(os.listdir("ledgers"))
print(len(names), "files:", names[0], "...", names[-1])
with gzip.open("ledgers/" + names[0], "rt") as f:
    for _ in range(4):
        print(f.readline().rstrip())
"""

SCRIPT = """\
import csv, gzip, os
import execbox

COLUMNS = ["quarter", "revenue", "cost"]
margins, rows = {}, 0
for name in sorted(os.listdir("ledgers")):
    with gzip.open("ledgers/" + name, "rt", newline="") as f:
        reader = csv.reader(f{dialect})
        header = next(reader)
        execbox.check(header == COLUMNS, "unexpected columns", file=name, header=header)
        revenue = cost = 0.0
        seen = set()
        for quarter, r, c in reader:
            execbox.check(quarter not in seen, "a quarter appears twice", file=name, quarter=quarter)
            seen.add(quarter)
            revenue += float(r)
            cost += float(c)
            rows += 1
    margins[name.split(".")[0]] = round((revenue - cost) / revenue, 4)
ranking = sorted(margins.items(), key=lambda kv: kv[1], reverse=True)
execbox.check(len(ranking) == 30, "expected 30 subsidiaries", found=len(ranking))
execbox.emit("ranking", ranking)
execbox.emit("rows", rows)
"""


def script(sniff: bool) -> str:
    """The first script assumes commas; the second reads each file's delimiter from its first line."""
    if not sniff:
        return SCRIPT.replace("{dialect}", "")
    return SCRIPT.replace(
        "        reader = csv.reader(f{dialect})",
        "        delimiter = ';' if ';' in f.readline() else ','\n        f.seek(0)\n"
        "        reader = csv.reader(f, delimiter=delimiter)",
    )


def ledgers(rows: int, *, semicolons: str | None = None, repeated: str | None = None) -> dict[str, bytes]:
    """Deterministic ledgers: `rows` quarters each (Q1 2000 onwards), margins differing per subsidiary."""
    files = {}
    for index, sub in enumerate(SUBSIDIARIES):
        rng = random.Random(index)
        target = 0.02 + 0.01 * ((index * 7) % 30)
        sep = ";" if sub == semicolons else ","
        lines = [sep.join(["quarter", "revenue", "cost"])]
        for q in range(rows):
            revenue = rng.randint(50_000, 150_000)
            cost = round(revenue * (1 - target + rng.uniform(-0.02, 0.02)))
            lines.append(sep.join([f"{2000 + q // 4}Q{q % 4 + 1}", str(revenue), str(cost)]))
        if sub == repeated:
            lines.append(lines[2])
        files[f"ledgers/{sub}.csv.gz"] = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    return files


def upload(box: Client, files: dict[str, bytes]) -> list[dict[str, str]]:
    return [{"path": path, "file_id": box.upload_file(path.split("/")[-1], data)["id"]} for path, data in files.items()]


def run(box: Client, trace: Trace, code: str, files: list[dict[str, str]]) -> ExecutionPublic:
    trace.conversation.add("model", f"```python\n{code}```")
    execution = trace.saw("execution", box.run(code, files=files, policy=POLICY, wait_s=300))
    trace.conversation.add("tool", outcome_of(execution))
    return execution


def answer(ranking: list[list[Any]]) -> str:
    top, bottom = ranking[0], ranking[-1]
    listed = ", ".join(f"{name} {margin:.1%}" for name, margin in ranking)
    return f"Highest net margin: {top[0]} ({top[1]:.1%}); lowest: {bottom[0]} ({bottom[1]:.1%}). Ranking: {listed}."


def play(box: Client, name: str, about: str, rows: int = 2400, **quirks: str) -> Trace:
    trace = Trace(EXAMPLE, name, about, Conversation())
    talk = trace.conversation
    talk.add("system", "You analyse data by writing Python that execbox runs; only declared outputs come back.")
    talk.add("user", TASK)
    files = upload(box, ledgers(rows, **quirks))
    talk.add("model", "I will look at the file list and the first lines of one ledger before writing the script.")
    run(box, trace, PEEK, files)
    done = run(box, trace, script(sniff=False), files)
    error: Mapping[str, Any] = done.get("error") or {}
    details = check_details(done)
    if done["status"] == "succeeded":
        trace.outcome = {"kind": "answer", "text": talk.add("model", answer(done["outputs"]["ranking"]))}
    elif error.get("category") == "check.failed" and "header" in details:
        talk.add("model", f"{details['file']} uses another delimiter ({details['header'][0]!r}); "
                          "the script will read each file's delimiter from its first line.")  # fmt: skip
        done = run(box, trace, script(sniff=True), files)
        if done["status"] == "succeeded":
            trace.outcome = {"kind": "answer", "text": talk.add("model", answer(done["outputs"]["ranking"]))}
        else:
            trace.outcome = {"kind": "stopped", "text": talk.add("model", "The second script failed too; stopping.")}
    else:
        text = (f"I cannot rank the subsidiaries yet: {details.get('file', 'a ledger')} has quarter "
                f"{details.get('quarter', '?')} twice, and which copy is right is for the controller to say. "
                "Please confirm the correct row or send a corrected ledger.")  # fmt: skip
        trace.outcome = {"kind": "escalated", "to": "controller", "text": talk.add("model", text)}
    return trace


SCENARIOS = {
    "success": lambda box: play(box, "success", "30 well-formed ledgers: one script, one answer"),
    "recoverable": lambda box: play(
        box,
        "recoverable",
        "S17 exports with semicolons: the check names it, a second script reads both",
        semicolons="S17",
    ),  # fmt: skip
    "escalate": lambda box: play(
        box, "escalate", "S09 lists a quarter twice: handed to the controller", repeated="S09"
    ),  # fmt: skip
}


def sizes(box: Client) -> None:
    """The success scenario at 2,400 and at 240,000 rows per file: the conversation stays the same size."""
    print("\n=== conversation size by data size (success scenario)")
    for rows in (2400, 240_000):
        trace = play(box, "success", "size", rows=rows)
        size = trace.conversation.size()
        print(f"{rows:>8,} rows per file ({30 * rows:>9,} in all): {size['messages']} messages, "
              f"{size['chars']:,} chars, {size['tokens']:,} tokens")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(EXAMPLE, SCENARIOS, sizes))
