"""E2B's quick-start as a user of the hosted service writes it, with the unmodified Python SDK
(`e2b-code-interpreter`): a sandbox, code that keeps its state, a matplotlib chart that comes back
as a PNG, a file written, read and listed, commands in the foreground and the background, kill.

Nothing in it names execbox: the SDK reads E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL from the
environment (docs/e2b.md). Against `make up`'s stack:

    export E2B_API_KEY=$(cat .run/api-key)
    export E2B_API_URL=http://127.0.0.1:8000/e2b
    export E2B_SANDBOX_URL=http://127.0.0.1:8000/e2b/sandbox
    .venv/bin/python examples/e2b_quickstart.py

It prints each step, then one JSON line of what it observed (tests/integration/test_e2b_quickstart.py
reads it), and exits 1 when something differs from what the hosted service gives.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

from e2b_code_interpreter import CommandExitException, Sandbox

CHART = """
import matplotlib.pyplot as plt

plt.plot([1, 2, 3, 4])
plt.ylabel('some numbers')
plt.show()
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

EXPECTED: dict[str, Any] = {
    "text": "42",
    "chartIsPng": True,
    "fileText": "hello from python\n",
    "listedHello": True,
    "commandStdout": "hello from python\ndone\n",
    "failedExitCode": 3,
    "backgroundListed": True,
    "backgroundKilled": True,
    "killed": True,
    "killedAgain": False,
}
"""What the hosted service gives for each observation that has one fixed answer."""


def main() -> dict[str, Any]:
    sbx = Sandbox.create(timeout=120)
    print(f"sandbox {sbx.sandbox_id}")
    observed: dict[str, Any] = {"sandboxId": sbx.sandbox_id}
    try:
        sbx.run_code("x = 20")
        execution = sbx.run_code("x + 22")
        print(f"x + 22 = {execution.text}")
        observed["text"] = execution.text

        chart = sbx.run_code(CHART)
        png = base64.b64decode(chart.results[0].png)
        print(f"chart: {len(png)} bytes of PNG")
        observed["chartIsPng"] = png.startswith(PNG_SIGNATURE)

        sbx.files.write("/home/user/hello.txt", "hello from python\n")
        observed["fileText"] = sbx.files.read("/home/user/hello.txt")
        observed["listedHello"] = "hello.txt" in [entry.name for entry in sbx.files.list("/home/user")]
        print(f"hello.txt: {observed['fileText']!r}")

        result = sbx.commands.run("cat /home/user/hello.txt && echo done")
        print(f"cat: {result.stdout!r} (exit {result.exit_code})")
        observed["commandStdout"] = result.stdout

        try:
            sbx.commands.run("exit 3")
            observed["failedExitCode"] = 0
        except CommandExitException as error:
            print(f"exit 3 raised {type(error).__name__} with exit code {error.exit_code}")
            observed["failedExitCode"] = error.exit_code

        sleeper = sbx.commands.run("sleep 30", background=True)
        observed["backgroundListed"] = sleeper.pid in [process.pid for process in sbx.commands.list()]
        observed["backgroundKilled"] = sbx.commands.kill(sleeper.pid)
        print(f"background sleep {sleeper.pid} killed: {observed['backgroundKilled']}")
    finally:
        observed["killed"] = sbx.kill()
    observed["killedAgain"] = Sandbox.kill(observed["sandboxId"])
    print(f"sandbox killed: {observed['killed']}, killed again: {observed['killedAgain']}")
    return observed


if __name__ == "__main__":
    observed = main()
    print(json.dumps(observed))
    wrong = {key: observed.get(key) for key, value in EXPECTED.items() if observed.get(key) != value}
    if wrong:
        print(f"differs from the hosted service's answers {EXPECTED}: {wrong}", file=sys.stderr)
        sys.exit(1)
