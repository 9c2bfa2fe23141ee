"""E2B's Python quick-start (examples/e2b_quickstart.py, the unmodified e2b-code-interpreter SDK)
against the live service as a separate process, set up only with E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL: it runs unchanged (docs/e2b.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT, Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
SCRIPT = ROOT / "examples" / "e2b_quickstart.py"


def run_quickstart(stack: Stack) -> dict[str, Any]:
    """The quick-start with the three variables an operator hands its agents (tenant alpha) and no
    other E2B_* variable; its last line, the JSON of what it observed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {"E2B_API_KEY": stack.keys["alpha"], "E2B_API_URL": f"{stack.base_url}/e2b",
            "E2B_SANDBOX_URL": f"{stack.base_url}/e2b/sandbox"}  # fmt: skip
    try:
        done = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{SCRIPT.name} did not finish in 120 s; stdout: {exc.stdout!r} stderr: {exc.stderr!r}")
    assert done.returncode == 0, f"{SCRIPT.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{SCRIPT.name} printed nothing; stderr: {done.stderr}"
    observed: dict[str, Any] = json.loads(lines[-1])
    return observed


def test_the_python_quickstart_runs_code_gets_a_png_chart_writes_a_file_runs_commands_and_kills(
    stack: Stack,
) -> None:
    seen = run_quickstart(stack)
    assert len(seen["sandboxId"]) == 26, f"Sandbox.create gave a sandbox id of 26 characters: {seen}"
    assert seen["text"] == "42", f"run_code('x = 20') then 'x + 22' gave text 42: {seen}"
    assert seen["chartIsPng"] is True, f"the chart's results[0].png decodes to bytes with the PNG signature: {seen}"
    assert seen["fileText"] == "hello from python\n", f"files.read gave back what files.write wrote: {seen}"
    assert seen["listedHello"] is True, f"files.list('/home/user') has an entry named hello.txt: {seen}"
    assert seen["commandStdout"] == "hello from python\ndone\n", f"commands.run's stdout is the file, 'done': {seen}"
    assert seen["failedExitCode"] == 3, f"commands.run('exit 3') raised CommandExitException, exit code 3: {seen}"
    assert seen["backgroundListed"] is True, f"a background 'sleep 30' is in commands.list() by its pid: {seen}"
    assert seen["backgroundKilled"] is True, f"commands.kill(pid) of the background command returned True: {seen}"
    assert seen["killed"] is True, f"sbx.kill() returned True: {seen}"
    assert seen["killedAgain"] is False, f"Sandbox.kill(id) of the ended sandbox returned False: {seen}"
