"""The weekly instrument-log report: a script both the in-process and the end-to-end tests
register (tests/unit/test_scripts_in_process.py, tests/integration/test_scripts.py)."""

from __future__ import annotations

from typing import Any

import httpx

REPORT = """
import json, os, execbox
errors, unreadable = {}, []
for path in sorted(execbox.inputs["logs"]):
    lines = open(path).read().splitlines()
    parsed = [l for l in lines if l[:4] in ("INFO", "WARN", "ERRO")]
    if lines and not parsed:  # a log it should understand yields nothing: a new format
        unreadable.append({"file": path, "first_line": lines[0][:80]})
    errors[path] = sum(1 for l in parsed if l.startswith("ERRO"))
execbox.check(not unreadable, "logs in a format this report does not read", unreadable=unreadable)
with open(os.path.join(execbox.output_dir, "report.md"), "w") as f:
    f.write("# Errors\\n" + "".join(f"- {p}: {n}\\n" for p, n in errors.items()))
execbox.emit("errors", sum(errors.values()))
"""


def register(api: httpx.Client, name: str, version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
    strings = {"type": "array", "items": {"type": "string"}}
    inputs = {"type": "object", "required": ["logs"], "properties": {"logs": strings}}
    body = {"name": name, "version": version, "code": REPORT, "description": "weekly instrument error report",
            "tags": ["reports"], "input_schema": inputs,
            "output_schema": {"type": "object", "required": ["errors"], "properties": {"errors": {"type": "integer"}}},
            **extra}  # fmt: skip
    answer = api.post("/v1/scripts", json=body)
    assert answer.status_code == 201, answer.text
    result: dict[str, Any] = answer.json()
    return result


def logs(api: httpx.Client, contents: dict[str, str]) -> list[dict[str, str]]:
    uploaded = [api.post("/v1/files", files={"file": (p, text.encode())}).json()["id"] for p, text in contents.items()]
    return [{"path": p, "file_id": f} for p, f in zip(contents, uploaded, strict=True)]
