"""`ebx`, the users' CLI (clients/python), run as a subprocess against the live service: exit
codes, --json, artifacts downloaded, output streamed while the program runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
EBX = str(ROOT / ".venv" / "bin" / "ebx")


def env(stack: Stack) -> dict[str, str]:
    return {**os.environ, "EXECBOX_URL": stack.base_url, "EXECBOX_API_KEY": stack.keys["alpha"],
            "EXECBOX_CONFIG": "/nonexistent"}  # fmt: skip


def ebx(stack: Stack, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EBX, *args], capture_output=True, text=True, env=env(stack), cwd=cwd, timeout=120)


def test_run_exits_with_the_programs_code_and_downloads_its_artifacts(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("from the laptop\n")
    (tmp_path / "job.py").write_text(
        "import execbox, os\n"
        "print(open('in/data.txt').read(), end='')\n"
        "open(os.path.join(execbox.output_dir, 'report.md'), 'w').write('# done\\n')\n"
        "raise SystemExit(3)\n"
    )
    done = ebx(stack, "run", "job.py", "--file", "data.txt:in/data.txt", "--out", "got", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "from the laptop\n" and "code.exit_nonzero" in done.stderr
    assert (tmp_path / "got" / "report.md").read_text() == "# done\n"


def test_json_output_and_the_exit_codes_of_categories_and_refusals(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print(6 * 7)\n")
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(30)\n")
    answer = ebx(stack, "--json", "run", "ok.py", cwd=tmp_path)
    assert answer.returncode == 0, answer.stderr
    execution = json.loads(answer.stdout)
    assert (execution["status"], execution["stdout"]) == ("succeeded", "42\n")
    assert json.loads(ebx(stack, "--json", "get", execution["id"], cwd=tmp_path).stdout)["id"] == execution["id"]

    timed_out = ebx(stack, "run", "slow.py", "--policy", "timeout_s=1", cwd=tmp_path)
    assert timed_out.returncode == 124 and "limit.timeout" in timed_out.stderr
    refused = ebx(stack, "run", "ok.py", "--policy", "memory_mb=524288", cwd=tmp_path)
    assert refused.returncode == 64 and "policy.memory_mb" in refused.stderr, refused.stderr
    unknown = ebx(stack, "get", "exe_" + "a" * 26, cwd=tmp_path)
    assert unknown.returncode == 64 and "404" in unknown.stderr
    unreachable = subprocess.run([EBX, "--url", "http://127.0.0.1:9", "get", execution["id"]], capture_output=True,
                                 text=True, env=env(stack), timeout=120)  # fmt: skip
    assert unreachable.returncode == 69 and "cannot reach" in unreachable.stderr


def test_output_arrives_while_the_program_still_runs(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "talk.py").write_text("import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n")
    with subprocess.Popen([EBX, "run", "talk.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env(stack), cwd=tmp_path) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() == "first\n"
        assert proc.poll() is None, "the first line came before the program ended"
        assert proc.stdout.readline() == "second\n"
        assert proc.wait(60) == 0


def test_a_session_keeps_state_between_commands(stack: Stack, tmp_path: Path) -> None:
    session = ebx(stack, "session", "new", cwd=tmp_path).stdout.strip()
    assert session.startswith("ses_")
    try:
        assert ebx(stack, "session", "exec", session, "x = 41", cwd=tmp_path).returncode == 0
        answer = ebx(stack, "session", "exec", session, "x + 1", cwd=tmp_path)
        assert answer.stdout.strip() == "42", answer.stderr
    finally:
        ended = ebx(stack, "--json", "session", "rm", session, cwd=tmp_path)
    assert json.loads(ended.stdout)["status"] != "active"


def test_plans_validate_and_run(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"format": "plan/v1", "steps": [
        {"id": "a", "run": {"code": "print(1)"}, "depends_on": ["missing"]}]}))  # fmt: skip
    steps = [{"id": "a", "run": {"code": "print(1)"}}, {"id": "b", "run": {"code": "print(2)"}, "depends_on": ["a"]}]
    (tmp_path / "good.json").write_text(json.dumps({"format": "plan/v1", "steps": steps}))
    invalid = ebx(stack, "plan", "validate", "bad.json", cwd=tmp_path)
    assert invalid.returncode == 64 and "plan.steps.0.depends_on.0" in invalid.stderr, invalid.stderr
    ran = ebx(stack, "--json", "plan", "run", "good.json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert {s: v["status"] for s, v in json.loads(ran.stdout)["steps"].items()} == {"a": "succeeded", "b": "succeeded"}


def test_plan_run_shows_each_step_as_it_changes(stack: Stack, tmp_path: Path) -> None:
    steps = [{"id": "a", "run": {"code": "print(1)"}},
             {"id": "b", "run": {"code": "import time\ntime.sleep(4)"}, "depends_on": ["a"]}]  # fmt: skip
    (tmp_path / "slow.json").write_text(json.dumps({"format": "plan/v1", "steps": steps}))
    with subprocess.Popen([EBX, "plan", "run", "slow.json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env(stack), cwd=tmp_path) as proc:  # fmt: skip
        assert proc.stderr is not None
        lines = []
        while "  a: succeeded\n" not in lines:
            lines.append(proc.stderr.readline())
            assert lines[-1], f"ebx ended before showing a's end: {lines}"
        shown = time.monotonic()
        assert proc.wait(60) == 0
        assert time.monotonic() - shown > 2, "a's end was shown while b (4 s) still ran, not with the run's end"
        assert "  b: succeeded\n" in lines + proc.stderr.readlines()
