"""An analysis agent in a session: dataset -> grouped statistics -> chart -> checks on the output
files. The DataFrame stays in the session's kernel between cells; the conversation sees a
five-row sample, each cell's short outcome and the files the last cells wrote.

- `success`: sales per region; a summary CSV and a bar chart; the checks on both files hold.
- `recoverable`: some amounts are exported as "n/a"; the statistics cell's check counts them; the
  planner converts them to missing values, says how many were left out, and goes on.
- `escalate`: the West region has no rows at all; comparing four regions with three would
  mislead, so the planner asks the analyst instead of charting.

    .venv/bin/python examples/analysis_agent.py
"""

from __future__ import annotations

import random
import sys

from execbox_client import Client, ExecutionPublic

from agent import Conversation, Trace, check_details, main, outcome_of

EXAMPLE = "analysis_agent"
REGIONS = ["North", "South", "East", "West"]

LOAD = """\
import pandas as pd
df = pd.read_csv("sales.csv")
print(df.shape)
print(df.head().to_string())
"""
STATS = """\
import execbox
raw = df["amount"]
df["amount"] = pd.to_numeric(raw, errors="coerce")
bad = int(df["amount"].isna().sum())
examples = raw[df["amount"].isna()].head(3).tolist(){dropped}
execbox.check(bad == 0, "amounts that are not numbers", rows=bad, examples=examples)
missing = sorted(set({regions}) - set(df["region"]))
execbox.check(not missing, "regions with no rows", missing=missing)
summary = df.groupby("region")["amount"].agg(["count", "sum", "mean"]).round(2).sort_values("sum", ascending=False)
summary.to_csv("out/summary.csv")
print(summary.to_string())
"""
CHART = """\
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
ax = summary["sum"].plot.bar(title="Sales by region")
ax.set_ylabel("amount")
plt.tight_layout()
plt.savefig("out/chart.png", dpi=80)
"""
CHECKS = """\
import pandas as pd
import execbox
written = pd.read_csv("out/summary.csv")
execbox.check(sorted(written["region"]) == sorted(summary.index), "summary.csv does not list every region")
execbox.check(abs(written["sum"].sum() - df["amount"].sum()) < 0.01, "summary.csv does not add up to the data")
with open("out/chart.png", "rb") as f:
    execbox.check(f.read(8) == b"\\x89PNG\\r\\n\\x1a\\n", "chart.png is not a PNG")
execbox.emit("regions", len(written))
execbox.emit("leader", str(written["region"].iloc[0]))
execbox.emit("total", round(float(written["sum"].sum()), 2))
"""


def stats(coerce: bool) -> str:
    """The statistics cell; the second version leaves out the rows whose amount is not a number."""
    dropped = ('\nprint(f"left out {bad} rows whose amount is not a number")\n'
               'df = df.dropna(subset=["amount"])\nbad = 0') if coerce else ""  # fmt: skip
    return "import pandas as pd\n" + STATS.replace("{dropped}", dropped).replace("{regions}", repr(REGIONS))


def dataset(name: str) -> bytes:
    rng = random.Random(7)
    lines = ["date,region,amount"]
    for day in range(120):
        for region in REGIONS:
            if name == "escalate" and region == "West":
                continue
            amount = f"{rng.uniform(100, 900) * (1 + REGIONS.index(region) / 4):.2f}"
            if name == "recoverable" and day % 40 == 3:
                amount = "n/a"
            lines.append(f"2026-{1 + day // 30:02d}-{1 + day % 28:02d},{region},{amount}")
    return ("\n".join(lines) + "\n").encode()


def cell(box: Client, trace: Trace, session: str, code: str) -> ExecutionPublic:
    trace.conversation.add("model", f"```python\n{code}```")
    done = trace.saw("cell", box.run(code, session=session, wait_s=120))
    text = outcome_of(done)
    if done.get("artifacts"):
        text += "\nfiles: " + ", ".join(f"{a['name']} ({a['media_type']})" for a in done["artifacts"])
    trace.conversation.add("tool", text)
    return done


def play(box: Client, name: str, about: str) -> Trace:
    trace = Trace(EXAMPLE, name, about, Conversation())
    talk = trace.conversation
    talk.add("system", "You are a data analyst with a Python session in execbox; files you write under out/ "
                       "come back as artifacts.")  # fmt: skip
    talk.add("user", "sales.csv has our 2026 sales. Compare the four regions (North, South, East, West): totals, "
                     "a chart, and check the files before you report.")  # fmt: skip
    file_id = box.upload_file("sales.csv", dataset(name))["id"]
    files = [{"path": "sales.csv", "file_id": file_id}]
    policy = {"timeout_s": 60, "memory_mb": 512}
    session = box.create_session("python", files=files, policy=policy, labels={"example": EXAMPLE})["id"]
    try:
        cell(box, trace, session, LOAD)
        done = cell(box, trace, session, stats(coerce=False))
        details = check_details(done)
        if "examples" in details:
            talk.add("model", f"{details['rows']} amounts are {details['examples'][0]!r}; I will leave those rows out "
                              "and say so in the report.")  # fmt: skip
            done = cell(box, trace, session, stats(coerce=True))
            details = check_details(done)
        if "missing" in details:
            text = (f"There are no rows at all for {', '.join(details['missing'])}, so a four-region "
                    "comparison would mislead. Is that region's data in another file, or should I compare "
                    "the other three?")  # fmt: skip
            trace.outcome = {"kind": "escalated", "to": "analyst", "text": talk.add("model", text)}
            return trace
        cell(box, trace, session, CHART)
        checked = cell(box, trace, session, CHECKS)
        if checked["status"] != "succeeded":
            trace.outcome = {"kind": "stopped", "text": talk.add("model", "The output files did not pass; stopping.")}
            return trace
        outputs = checked["outputs"]
        left_out = " (rows without a number left out, as said)" if "left out" in done["stdout"] else ""
        text = (f"{outputs['regions']} regions, {outputs['total']:,.2f} in all{left_out}; leader: {outputs['leader']}. "
                "summary.csv and chart.png are attached; both passed the checks.")  # fmt: skip
        trace.outcome = {"kind": "answer", "text": talk.add("model", text)}
        return trace
    finally:
        box.delete_session(session)


SCENARIOS = {
    "success": lambda box: play(box, "success", "statistics, chart and file checks in one session"),
    "recoverable": lambda box: play(
        box, "recoverable", "'n/a' amounts: the check counts them, the planner leaves them out and says so"
    ),  # fmt: skip
    "escalate": lambda box: play(box, "escalate", "a region with no rows: the analyst is asked"),
}

if __name__ == "__main__":
    sys.exit(main(EXAMPLE, SCENARIOS))
