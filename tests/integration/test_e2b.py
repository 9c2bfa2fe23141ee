"""The unmodified E2B SDK (e2b 2.63, e2b-code-interpreter 2.11) against the live service, set up
only with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL: a sandbox is a session, its cells are
executions, and another tenant's key neither sees nor reaches it (docs/e2b.md)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import httpx
import pytest
from e2b import RateLimitException, SandboxException, SandboxQuery, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.conftest import Stack, auth, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]
PNG = b"\x89PNG\r\n\x1a\n"


def test_run_code_keeps_state_between_cells_and_counts_them(sandbox: Sandbox) -> None:
    first = sandbox.run_code("x = 41\nprint('set', x)")
    second = sandbox.run_code("x + 1")
    assert first.error is None and first.logs.stdout == ["set 41\n"], first
    assert second.text == "42" and second.results[0].is_main_result, second
    assert second.execution_count == first.execution_count + 1 == 2
    environment = sandbox.run_code("import os\nos.environ['WHERE'], os.environ.get('CELL')", envs={"CELL": "this one"})
    assert environment.text == "('sandbox', 'this one')", environment
    assert sandbox.run_code("os.environ.get('CELL')").text is None, "a cell's envs are its own"
    with pytest.raises(SandboxException, match="env_vars"):
        sandbox.run_code("1", envs={"1 BAD": "x"})


def test_a_plot_comes_back_as_png_and_an_error_with_its_traceback(sandbox: Sandbox) -> None:
    shown = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    failed = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    (plot,) = [r for r in shown.results if r.png]
    assert base64.b64decode(plot.png).startswith(PNG) and not plot.is_main_result, shown
    assert failed.error is not None and failed.error.name == "ZeroDivisionError", failed
    assert failed.error.value == "division by zero" and "in f" in failed.error.traceback, failed.error
    assert sandbox.run_code("x = 1").error is None, "the sandbox lives on after an error"


def test_kill_ends_the_sandbox_and_its_calls_say_so(e2b_env: Stack) -> None:
    sbx = Sandbox.create(timeout=120)
    assert sbx.run_code("1 + 1").text == "2" and sbx.is_running()
    assert sbx.kill() is True
    assert not sbx.is_running(), "/health answers 502 once it ended"
    assert Sandbox.kill(sbx.sandbox_id) is False, "killing it again finds nothing"
    with pytest.raises(SandboxException, match="timeout|not found"):
        sbx.run_code("1")


def test_set_timeout_ends_the_sandbox_when_it_passes(e2b_env: Stack) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.run_code("1").error is None
        sbx.set_timeout(1)
        wait_until(lambda: not sbx.is_running(), 20, "the sandbox to end one second after set_timeout(1)")
        assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_list_filters_by_metadata_and_connect_reaches_the_same_state(sandbox: Sandbox) -> None:
    sandbox.run_code("shared = 'from the first client'")
    listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b"})).next_items()
    assert sandbox.sandbox_id in {s.sandbox_id for s in listed}
    assert not Sandbox.list(query=SandboxQuery(metadata={"suite": "other"})).next_items()
    other_client = Sandbox.connect(sandbox.sandbox_id)
    assert other_client.run_code("shared").text == "'from the first client'"
    assert other_client.get_info().metadata == {"suite": "e2b"}


def test_the_async_sdk_streams_output_while_the_cell_runs(e2b_env: Stack) -> None:
    async def main() -> tuple[list[str], str | None, bool]:
        sbx = await AsyncSandbox.create(timeout=120)
        chunks: list[str] = []
        try:
            cell = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n'done'"
            execution = await sbx.run_code(cell, on_stdout=lambda m: chunks.append(m.line))
        finally:
            killed = await sbx.kill()
        return chunks, execution.text, killed

    chunks, text, killed = asyncio.run(main())
    assert "".join(chunks) == "0\n1\n2\n" and len(chunks) >= 2, f"output came in pieces as it was written: {chunks}"
    assert text == "'done'" and killed


def test_another_tenants_key_neither_sees_nor_reaches_the_sandbox(
    sandbox: Sandbox, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.run_code("secret = 'alpha only'")
    monkeypatch.setenv("E2B_API_KEY", stack.keys["beta"])
    assert sandbox.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id)
    assert Sandbox.kill(sandbox.sandbox_id) is False
    with Sandbox.create(timeout=60) as own:  # beta's own token does not open alpha's sandbox
        assert own.run_code("'secret' in globals()").text == "False"
    with httpx.Client(base_url=f"{stack.base_url}/e2b/sandbox") as raw:
        forged = raw.post("/execute", json={"code": "secret"},
                          headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "guess"})  # fmt: skip
        unauthenticated = raw.get("/health", headers={"E2b-Sandbox-Id": sandbox.sandbox_id})
    assert forged.status_code == 401 and unauthenticated.status_code == 401, (forged.text, unauthenticated.text)
    assert sandbox.run_code("secret").text == "'alpha only'", "alpha's sandbox is untouched"


def test_a_facade_user_is_counted_in_the_native_sessions_records_metrics_and_quota(
    e2b_env: Stack, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_API_KEY", stack.keys["beta"])
    native = httpx.Client(base_url=stack.base_url, headers=auth(stack.keys["beta"]), timeout=60)
    opened: list[str] = []
    sbx = Sandbox.create(timeout=120)
    try:
        before = _accepted(native)
        assert sbx.run_code("1 + 1").text == "2"
        session = native.get(f"/v1/sessions/ses_{sbx.sandbox_id}").json()
        assert session["status"] == "ready" and session["executions"] == 1, session
        assert _accepted(native) == before + 1, "the cell is an accepted execution in the API's metrics"
        while (answer := native.post("/v1/sessions", json={"language": "python"})).status_code == 201:
            opened.append(answer.json()["id"])
        assert answer.status_code == 429, answer.text
        with pytest.raises(RateLimitException):
            Sandbox.create(timeout=60)
        assert len(opened) + 1 == 4, "the sandbox took one of the tenant's four session slots (half the fleet's 8)"
    finally:
        sbx.kill()
        for sid in opened:
            native.delete(f"/v1/sessions/{sid}")
        native.close()


def _accepted(client: httpx.Client) -> float:
    metrics = client.get("/metrics").text
    line = next(m for m in metrics.splitlines() if m.startswith('execbox_executions_accepted_total{language="python"}'))
    return float(line.rsplit(" ", 1)[1])


def test_what_is_not_offered_fails_at_once_with_a_clear_error(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="'r' is not offered here; offered: python, javascript, bash"):
        sandbox.create_code_context(language="r")
    with pytest.raises(SandboxException, match="language"):
        sandbox.run_code("1", language="typescript")
    with pytest.raises(SandboxException, match="templateID"):
        Sandbox.create(template="no-such-template")


def test_two_python_contexts_do_not_see_each_other_and_restart_or_remove_empties_one(sandbox: Sandbox) -> None:
    sandbox.run_code("secret = 'default'")
    other = sandbox.create_code_context()
    assert (other.language, other.cwd) == ("python", "/home/user") and other.id.startswith("python-"), other
    assert sandbox.run_code("'secret' in globals()", context=other).text == "False"
    sandbox.run_code("mine = 2", context=other)
    assert sandbox.run_code("'mine' in globals(), secret").text == "(False, 'default')"
    assert sandbox.run_code("mine", context=other).text == "2"
    listed = {c.id: c.language for c in sandbox.list_code_contexts()}
    assert listed == {"python": "python", "javascript": "javascript", "bash": "bash", other.id: "python"}, listed

    sandbox.restart_code_context(other)
    assert sandbox.run_code("'mine' in globals()", context=other).text == "False", "restarted: empty"
    assert sandbox.run_code("secret").text == "'default'", "the other context is untouched"
    sandbox.remove_code_context(other.id)
    assert other.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(SandboxException, match="code context"):
        sandbox.run_code("1", context=other)


def test_javascript_and_bash_contexts_keep_their_state(sandbox: Sandbox) -> None:
    assert sandbox.run_code("const seen = [1, 2]; seen.length", language="js").text == "2"
    pushed = sandbox.run_code("seen.push(3); console.log('now', seen.length); seen", language="javascript")
    assert pushed.text == "[ 1, 2, 3 ]" and pushed.logs.stdout == ["now 3\n"], pushed
    failed = sandbox.run_code("notDefined.field", language="js")
    assert failed.error is not None and failed.error.name == "ReferenceError", failed
    assert "notDefined is not defined" in failed.error.value, failed.error

    there = sandbox.create_code_context(language="js", cwd="/tmp")
    assert (there.language, there.cwd) == ("javascript", "/tmp"), there
    assert sandbox.run_code("[typeof seen, process.cwd()]", context=there).text == "[ 'undefined', '/tmp' ]"
    sandbox.restart_code_context(there)
    assert sandbox.run_code("process.cwd()", context=there).text == "'/tmp'", "restarted where it was made"

    sandbox.run_code("count=5\ncd /tmp", language="bash")
    shell = sandbox.run_code("echo $count $(pwd)", language="bash")
    assert shell.logs.stdout == ["5 /tmp\n"] and shell.error is None, shell
    with pytest.raises(SandboxException, match="cwd"):
        sandbox.create_code_context(language="bash", cwd="/no/such/directory")


def test_a_cell_the_client_gives_up_on_is_interrupted_and_the_sandbox_takes_the_next(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 'before'")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\ntime.sleep(60)", timeout=1)
    started = time.monotonic()
    after = sandbox.run_code("kept")
    assert after.text == "'before'", "the kernel was interrupted, not restarted: its variables are kept"
    assert time.monotonic() - started < 20, "the next cell did not wait for the abandoned one's 60 s"


def test_a_cell_in_flight_when_the_sandbox_is_killed_raises_what_the_sdk_says_of_a_killed_sandbox(
    e2b_env: Stack, stack: Stack
) -> None:
    sbx = Sandbox.create(timeout=120)
    native = httpx.Client(base_url=stack.base_url, headers=auth(stack.keys["alpha"]), timeout=30)
    raised: list[BaseException] = []

    def long_cell() -> None:
        try:
            sbx.run_code("import time\ntime.sleep(60)")
        except BaseException as exc:
            raised.append(exc)

    cell = threading.Thread(target=long_cell)
    try:
        cell.start()
        wait_until(lambda: native.get(f"/v1/sessions/ses_{sbx.sandbox_id}").json()["running"], 30, "the cell to run")
        assert Sandbox.kill(sbx.sandbox_id) is True
        cell.join(30)
        assert not cell.is_alive(), "the in-flight call ended with the sandbox"
        assert len(raised) == 1 and isinstance(raised[0], TimeoutException), raised
        assert "killed while the request was in progress" in str(raised[0]), raised[0]
    finally:
        native.close()
