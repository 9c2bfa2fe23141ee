"""The unmodified E2B JavaScript SDK (@e2b/code-interpreter from npm, pinned in tests/e2b-node) against
the live service through Node, set up only with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL: the
quickstart a user of the hosted service writes (tests/e2b-node/quickstart.mjs) runs unchanged
(docs/e2b.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
SOURCE = ROOT / "tests" / "e2b-node"
"""The Node project as committed: package.json, its lock, the quickstart."""
PROJECT = ROOT / ".run" / "e2b-node"
"""Where it is installed and run: outside the test tree, whose every .py file the checks read (npm
packages ship some)."""
NODE = PROJECT / "node_modules" / ".bin" / "node"
"""Node 20.20.2 from npm's `node` package (locked in tests/e2b-node): the SDK needs 20.18.1 or newer,
and the machine's own Node may be older (Debian 12 ships 18)."""


@pytest.fixture(scope="session")
def node_project() -> Path:
    """tests/e2b-node copied to .run/e2b-node with its locked dependencies installed: `npm ci` once,
    when node_modules is missing or older than package-lock.json (its output only in a failure's message)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH: run scripts/install (apt-get install npm)")
    PROJECT.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json", "quickstart.mjs"):
        shutil.copy2(SOURCE / name, PROJECT / name)
    stamp = PROJECT / "node_modules" / ".package-lock.json"  # npm writes it on every install
    lock = PROJECT / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PROJECT, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        if done.returncode != 0:
            pytest.fail(
                f"npm ci in {PROJECT} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
    return PROJECT


def run_node(project: Path, script: str, stack: Stack) -> dict[str, Any]:
    """`node script` with the three variables an operator hands its agents (tenant alpha) and no
    other E2B_* variable; its one JSON line of observations."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {"E2B_API_KEY": stack.keys["alpha"], "E2B_API_URL": f"{stack.base_url}/e2b",
            "E2B_SANDBOX_URL": f"{stack.base_url}/e2b/sandbox"}  # fmt: skip
    try:
        done = subprocess.run([str(NODE), script], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"node {script} did not finish in 120 s; stdout: {exc.stdout!r} stderr: {exc.stderr!r}")
    assert done.returncode == 0, f"node {script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"node {script} printed nothing; stderr: {done.stderr}"
    observed: dict[str, Any] = json.loads(lines[-1])
    return observed


def test_the_js_sdk_quickstart_runs_code_gets_a_png_writes_a_file_runs_commands_and_kills_once(
    node_project: Path, stack: Stack
) -> None:
    seen = run_node(node_project, "quickstart.mjs", stack)
    assert len(seen["sandboxId"]) == 26, f"Sandbox.create gave a sandbox id of 26 characters: {seen}"
    assert seen["setError"] is None and seen["text"] == "42", f"runCode('x = 20') then 'x + 22' gave text 42: {seen}"
    assert seen["plotError"] is None and seen["pngCount"] == 1, f"the matplotlib plot came back as one png: {seen}"
    assert seen["pngIsPng"] is True, f"the plot's png decodes from base64 to bytes with the PNG signature: {seen}"
    assert seen["errorName"] == "ZeroDivisionError", f"runCode('1/0') has error.name ZeroDivisionError: {seen}"
    assert seen["errorValue"] == "division by zero", f"and error.value 'division by zero': {seen}"
    assert seen["fileText"] == "hello from node", f"files.read gave back what files.write wrote: {seen}"
    assert seen["listedHello"] is True, f"files.list('/home/user') has an entry named hello.txt: {seen}"
    assert seen["commandExitCode"] == 0, f"commands.run('cat ... && echo done') resolved with exitCode 0: {seen}"
    assert seen["commandStdout"] == "hello from nodedone\n", f"and its stdout is the file, then 'done': {seen}"
    assert seen["failedCommand"] == "CommandExitError", f"commands.run('exit 3') rejected with CommandExitError: {seen}"
    assert seen["failedExitCode"] == 3, f"whose exitCode is 3: {seen}"
    assert seen["backgroundListed"] is True, f"a background 'sleep 30' is in commands.list() by its pid: {seen}"
    assert seen["backgroundKilled"] is True, f"commands.kill(pid) of the background command resolved true: {seen}"
    assert seen["backgroundEnd"] == "CommandExitError", f"its handle's wait() then rejected (killed): {seen}"
    assert seen["backgroundListedAfterKill"] is False, f"and commands.list() no longer has it: {seen}"
    assert seen["killed"] is True, f"sbx.kill() resolved true: {seen}"
    assert seen["killedAgain"] is False, f"Sandbox.kill(id) of the ended sandbox resolved false: {seen}"
