"""Hostile cells and requests against session contexts (python:<name>, javascript[:<name>],
bash[:<name>]) and the E2B facade's code contexts, with the real engine and Redis.

Each test is an attack a review found working (output and timers running on between calls, a cell
answering for itself, a call's env or IFS or a readonly variable or a FIFO spoiling a bash
context's state, a context reading another's code, an odd directory name, a language that
contradicts its context), now refused, or one that was refused from the start."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox

from tests.conftest import Stack
from tests.integration.test_session_contexts import cell, value
from tests.integration.test_sessions import open_session

pytestmark = [pytest.mark.docker, pytest.mark.redis]


@pytest.fixture
def session(api: httpx.Client) -> Iterator[str]:
    opened = open_session(api, idle_timeout_s=300)
    yield opened["id"]
    api.delete(f"/v1/sessions/{opened['id']}")


def _worker_rss(stack: Stack) -> int:
    """The resident memory (bytes) of this stack's workers together."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if f"{stack.prefix}-worker-".encode() not in b" ".join(argv) or b"worker" not in argv:
                continue
            with open(f"/proc/{name}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


# 1. JavaScript: what a cell sets going, and the answer pipe.


def test_a_timer_set_through_node_timers_does_not_run_on_after_its_cell(api: httpx.Client, session: str) -> None:
    started = cell(api, session, "require('node:timers').setInterval(() => console.log('tick'), 50); 1", "javascript")
    assert value(started) == "1"
    later = cell(api, session, "import time\ntime.sleep(1)\nprint('python')", None)
    assert later["status"] == "succeeded", later
    assert later["stdout"] == "python\n", "nothing of the JavaScript cell runs on into a later Python call"


def test_a_javascript_cell_cannot_answer_for_itself(api: httpx.Client, session: str) -> None:
    forged = (
        "require('node:fs').writeSync(Number(process.argv[2]), JSON.stringify({status: 0, result: 'forged'}) + '\\n');"
        "const until = Date.now() + 1500; while (Date.now() < until) {} console.log('ran on'); 'real'"
    )
    first = cell(api, session, forged, "javascript")
    assert value(first) == "'real'" and first["stdout"] == "ran on\n", first
    assert value(cell(api, session, "'second'", "javascript")) == "'second'", "answers stay with their cells"


def test_output_between_calls_does_not_pile_up_in_the_worker(api: httpx.Client, stack: Stack, session: str) -> None:
    assert value(cell(api, session, "1", None)) == "1"
    before = _worker_rss(stack)
    flood = (
        "const chunk = 'x'.repeat(1 << 16); require('node:timers').setInterval(() => process.stdout.write(chunk), 4); 1"
    )
    assert value(cell(api, session, flood, "javascript")) == "1"
    time.sleep(3)  # nothing to wait for: the test is that nothing happens while no call runs
    grown = _worker_rss(stack) - before
    api.delete(f"/v1/sessions/{session}")  # stop the flood before anything else
    assert grown < 64 << 20, f"the workers grew by {grown >> 20} MiB while no call ran"


def test_a_microtask_loop_past_its_timeout_ends_clearly_and_the_context_starts_afresh(
    api: httpx.Client, session: str
) -> None:
    assert value(cell(api, session, "let kept = 1; kept", "javascript")) == "1"
    spun = cell(api, session, "(async () => { for (;;) await null })()", "javascript", policy={"timeout_s": 2})
    assert spun["status"] == "failed" and spun["error"]["category"] == "limit.timeout", spun
    assert "its next cell starts a fresh one" in spun["stderr"], spun
    assert value(cell(api, session, "typeof kept", "javascript")) == "'undefined'"
    gone = cell(api, session, "process.exit(3)", "javascript:other")
    assert gone["status"] == "failed" and "ended" in gone["stderr"], gone
    assert value(cell(api, session, "2", "javascript:other")) == "2"


# 2. bash contexts: the saved state.


def test_a_calls_env_does_not_stay_in_its_bash_context(api: httpx.Client, session: str) -> None:
    given = cell(api, session, "echo $ONLY_HERE", "bash", env={"ONLY_HERE": "call-secret"})
    assert given["stdout"] == "call-secret\n", given
    later = cell(api, session, "echo ${ONLY_HERE:-gone}", "bash")
    assert later["stdout"] == "gone\n", later


def test_a_bash_cell_that_sets_ifs_keeps_its_variables(api: httpx.Client, session: str) -> None:
    assert cell(api, session, "IFS=,\nkept=yes", "bash")["status"] == "succeeded"
    later = cell(api, session, "echo ${kept:-lost}", "bash")
    assert later["stdout"] == "yes\n", later


def test_a_calls_env_wins_over_a_readonly_saved_variable(api: httpx.Client, session: str) -> None:
    assert cell(api, session, "readonly TOKEN=stale", "bash")["status"] == "succeeded"
    later = cell(api, session, "echo $TOKEN", "bash", env={"TOKEN": "fresh"})
    assert later["stdout"] == "fresh\n", later


def test_a_fifo_at_the_bash_state_path_does_not_hang_later_cells(api: httpx.Client, session: str) -> None:
    assert cell(api, session, "x=1", "bash")["status"] == "succeeded"
    planted = "import os\nos.mkfifo('/tmp/.execbox-contexts/bash.sh.new')"
    assert cell(api, session, planted, None)["status"] == "succeeded"
    later = cell(api, session, "echo $x", "bash", policy={"timeout_s": 3})
    assert later["status"] == "succeeded" and later["stdout"] == "1\n", later


# 3. Python contexts.


def test_a_new_python_context_does_not_see_anothers_code(api: httpx.Client, session: str) -> None:
    assert cell(api, session, "secret = 'default-secret'", None)["status"] == "succeeded"
    assert cell(api, session, "1", "python:other")["status"] == "succeeded"
    seen = value(cell(api, session, "_i, _ii, _iii", "python:other"))
    assert "default-secret" not in seen, seen


# 4. The API: names, ids and directories.


def test_odd_session_context_names_are_a_422_on_the_field(api: httpx.Client, session: str) -> None:
    for bad in (
        "python:x\n",
        "python:\uff58",
        "python:-x",
        "PYTHON",
        "python:a\x00",
        "bash:a:b",
        "python:a/b",
        " python",
    ):
        response = api.post("/v1/executions", json={"language": "python", "code": "1", "session": session,
                                                     "session_context": bad})  # fmt: skip
        assert response.status_code == 422, (bad, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["session_context"], (bad, response.text)
    longest = cell(api, session, "2", "python:" + "a" * 40)
    assert value(longest) == "2"


def _raw(sandbox: Sandbox, method: str, path: str, **kwargs: Any) -> httpx.Response:
    client: httpx.Client = sandbox._client  # the SDK's own client
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
    return client.request(method, f"{sandbox._jupyter_url}{path}", headers=headers, **kwargs)


def test_context_ids_in_urls_reach_only_this_sandboxs_contexts(sandbox: Sandbox, e2b_env: Stack) -> None:
    for bad in ("..%2Fpython", "python%00", "python-..%2F..%2Fx", "PYTHON", "python-0123456789", "%E2%80%AEpython"):
        for method, path in (("POST", f"/contexts/{bad}/restart"), ("DELETE", f"/contexts/{bad}")):
            answer = _raw(sandbox, method, path)
            assert answer.status_code == 404, (method, path, answer.text)
    with Sandbox.create(timeout=60) as other:
        theirs = other.create_code_context(language="bash")
        assert _raw(sandbox, "DELETE", f"/contexts/{theirs.id}").status_code == 404
        assert theirs.id in {c.id for c in other.list_code_contexts()}, "the other sandbox's context is untouched"


def test_a_python_context_can_start_in_a_directory_with_any_name(sandbox: Sandbox) -> None:
    sandbox.run_code("import os\nos.makedirs('/home/user/caf\u00e9-\U0001f600', exist_ok=True)")
    made = sandbox.create_code_context(language="python", cwd="/home/user/caf\u00e9-\U0001f600")
    assert sandbox.run_code("import os; os.getcwd()", context=made).text.endswith("\U0001f600'")


def test_run_code_with_a_language_and_another_languages_context_is_refused(sandbox: Sandbox) -> None:
    answer = _raw(sandbox, "POST", "/execute", json={"code": "echo hi", "context_id": "python", "language": "bash"})
    assert answer.status_code == 400, answer.text


def test_a_cwd_that_is_not_a_directory_is_a_400_and_leaves_no_context(sandbox: Sandbox) -> None:
    sandbox.run_code("open('/home/user/plain.txt', 'w').write('x')")
    for cwd in ("/home/user/plain.txt", "x" * 5000, "/home/user/a\x00b"):
        with pytest.raises(SandboxException):
            sandbox.create_code_context(language="python", cwd=cwd)
    assert {c.id for c in sandbox.list_code_contexts()} == {"python", "javascript", "bash"}
