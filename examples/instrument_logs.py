"""The weekly instrument-log report, with its ear: a script in the library, on a schedule, that
wakes the conversation only when the week's logs are not what it was written for.

The planner writes the report once and schedules it (Mondays 07:00, Europe/Oslo). Each scenario
then runs one week's firing as the scheduler would (the script invoked with that week's logs, so
that the example does not wait for Monday) and reads `GET /v1/events` for the surprise:

- `success`: plain-text logs; the report runs quietly and no event is made: no model turn at all.
- `recoverable`: one instrument now writes JSON lines; the check names the file and its first
  line; the `script.failed` event resumes the conversation, the planner registers version 1.1.0
  that reads both formats, runs the week again and moves the schedule to it.
- `escalate`: one instrument wrote nothing this week; no code fixes a silent instrument, so the
  planner hands it to the lab manager.

    .venv/bin/python examples/instrument_logs.py
"""

from __future__ import annotations

import json
import sys

from execbox_client import Client, ExecutionPublic

from agent import Conversation, Trace, check_details, main, outcome_of, wait_for_event

EXAMPLE = "instrument_logs"
NAME = "lab.weekly_instrument_report"
INSTRUMENTS = ["centrifuge", "incubator", "spectrometer"]
SCHEMAS = {
    "input_schema": {"type": "object", "required": ["logs"],
                     "properties": {"logs": {"type": "array", "items": {"type": "string"}, "minItems": 1}}},
    "output_schema": {"type": "object", "required": ["errors", "warnings"]},
}  # fmt: skip

REPORT = """\
import execbox

LEVELS = ("INFO", "WARN", "ERRO")
counts = {"errors": {}, "warnings": {}}
unreadable, silent = [], []
for path in execbox.inputs["logs"]:
    lines = open(path).read().splitlines()
    if not lines:
        silent.append(path)
        continue
    levels = [line[:4] for line in lines if line[:4] in LEVELS]{json_lines}
    if not levels:  # not empty and nothing it knows: a new format, not a quiet week
        unreadable.append({"file": path, "first_line": lines[0][:80]})
    counts["errors"][path] = levels.count("ERRO")
    counts["warnings"][path] = levels.count("WARN")
execbox.check(not silent, "instruments wrote no log this week", silent=silent)
execbox.check(not unreadable, "logs in a format this report does not read", unreadable=unreadable)
execbox.emit("errors", counts["errors"])
execbox.emit("warnings", counts["warnings"])
"""
JSON_LINES = """
    if not levels and lines[0].startswith("{"):  # JSON lines: {"level": "warn", ...}
        import json
        levels = [{"error": "ERRO", "warn": "WARN"}.get(json.loads(l).get("level"), "INFO") for l in lines]"""


def report(version: str) -> str:
    return REPORT.replace("{json_lines}", JSON_LINES if version != "1.0.0" else "")


PLAIN = {
    "centrifuge.log": "INFO spin-up 4000 rpm\nWARN imbalance detected\nINFO run complete\n",
    "incubator.log": "INFO 37.0 C\nERRO door open 12 min\nINFO 37.1 C\n",
    "spectrometer.log": "INFO calibration ok\nINFO 96 samples read\n",
}
WEEKS = {
    "success": PLAIN,
    "recoverable": {
        **PLAIN,
        "spectrometer.log": "".join(
            json.dumps(line) + "\n"
            for line in ({"level": "info", "msg": "firmware 2.0"}, {"level": "warn", "msg": "lamp hours 1900"})
        ),
    },  # fmt: skip
    "escalate": {**PLAIN, "incubator.log": ""},
}


def register(box: Client, trace: Trace, version: str) -> None:
    code = report(version)
    trace.conversation.add("model", f"Registering {NAME}@{version}:\n```python\n{code}```")
    body = {"name": NAME, "version": version, "code": code, "tags": ["lab", "weekly"],
            "description": "Errors and warnings per instrument log, with checks for silent instruments "
                           "and unreadable formats.", **SCHEMAS}  # fmt: skip
    box.register_script(body)
    trace.service.append({"call": f"register {version}", "status": "registered", "category": None})


def schedule(box: Client, trace: Trace, version: str, files: list[dict[str, str]]) -> str:
    body = {"script": f"{NAME}@{version}", "cron": "0 7 * * 1", "timezone": "Europe/Oslo",
            "inputs": {"logs": sorted(WEEKS["success"])}, "files": files}  # fmt: skip
    created = box.create_schedule(body)
    trace.service.append(
        {"call": f"schedule {version}", "status": "paused" if created["paused"] else "active", "category": None}
    )
    return str(created["id"])


def fire(box: Client, trace: Trace, version: str, files: list[dict[str, str]]) -> ExecutionPublic:
    """One week's firing, as the schedule makes it: the script with the week's logs."""
    body = {"version": version, "inputs": {"logs": sorted(WEEKS["success"])}, "files": files}
    return trace.saw(f"firing {version}", box.invoke_script(NAME, body, wait_s=60))


def play(box: Client, name: str, about: str) -> Trace:
    trace = Trace(EXAMPLE, name, about, Conversation())
    talk = trace.conversation
    talk.add("system", "You keep the lab's recurring reports as scripts in execbox's library.")
    talk.add("user", "Every Monday, count errors and warnings per instrument from last week's logs, and tell me "
                     "only when something needs attention.")  # fmt: skip
    register(box, trace, "1.0.0")
    files = [{"path": path, "file_id": box.upload_file(path, data.encode())["id"]}
             for path, data in WEEKS[name].items()]  # fmt: skip
    schedule_id = schedule(box, trace, "1.0.0", files)
    talk.add("model", "Scheduled for Mondays 07:00 (Europe/Oslo). You will hear from me only if a check fails.")
    week = fire(box, trace, "1.0.0", files)
    if week["status"] == "succeeded":
        trace.outcome = {"kind": "quiet", "report": week["outputs"]}  # the conversation is not resumed
        box.delete_schedule(schedule_id)
        return trace
    event = trace.saw("event", wait_for_event(box, week["id"]))
    talk.add("tool", f"event script.failed from {event['script']}:\n" + outcome_of(week))
    details = check_details(event)
    if "unreadable" in details:
        bad = details["unreadable"][0]
        talk.add("model", f"{bad['file']} now writes JSON lines ({bad['first_line'][:30]}...). Version 1.1.0 reads "
                          "both formats; re-running this week and moving the schedule to it.")  # fmt: skip
        register(box, trace, "1.1.0")
        again = fire(box, trace, "1.1.0", files)
        box.delete_schedule(schedule_id)
        schedule_id = schedule(box, trace, "1.1.0", files)
        talk.add("tool", outcome_of(again))
        text = (f"This week: errors {again['outputs']['errors']}, warnings {again['outputs']['warnings']}. "
                f"The report now reads {bad['file']}'s new format.")  # fmt: skip
        trace.outcome = {"kind": "answer", "text": talk.add("model", text)}
    else:
        text = (f"{', '.join(details['silent'])} wrote nothing this week. That is the instrument (or its "
                "logging), not the report: please have someone check it. I have not changed the script.")  # fmt: skip
        trace.outcome = {"kind": "escalated", "to": "lab manager", "text": talk.add("model", text)}
    box.delete_schedule(schedule_id)
    return trace


SCENARIOS = {
    "success": lambda box: play(box, "success", "plain-text logs: a quiet week, no event, no model turn"),
    "recoverable": lambda box: play(
        box, "recoverable", "a JSON log: the ear raises, the event resumes the conversation, version 1.1.0 reads both"
    ),  # fmt: skip
    "escalate": lambda box: play(box, "escalate", "a silent instrument: handed to the lab manager"),
}

if __name__ == "__main__":
    sys.exit(main(EXAMPLE, SCENARIOS))
