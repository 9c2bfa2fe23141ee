"""A session's contexts against the real engine and Redis: more Python namespaces, JavaScript and
bash beside the session's own interpreter, each keeping its state and seeing no other's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_sessions import open_session

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def cell(client: httpx.Client, session_id: str, code: str, context: str | None, **extra: Any) -> dict[str, Any]:
    request = {"language": "python", "code": code, "session": session_id, "session_context": context, **extra}
    response = client.post("/v1/executions?wait=60", json=request)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] not in ("queued", "running"), body
    assert body["session_context"] == context
    return body


def value(execution: dict[str, Any]) -> str:
    assert execution["status"] == "succeeded", execution
    found = [r for r in execution["results"] if r["kind"] == "execute_result"]
    assert len(found) == 1, execution
    text: str = found[0]["data"]["text/plain"]["text"]
    return text


@pytest.fixture
def session(api: httpx.Client) -> Iterator[str]:
    opened = open_session(api, idle_timeout_s=300)
    yield opened["id"]
    api.delete(f"/v1/sessions/{opened['id']}")


def test_two_python_contexts_do_not_see_each_others_variables_or_results(api: httpx.Client, session: str) -> None:
    assert cell(api, session, "secret = 'default'\nsecret", None)["status"] == "succeeded"
    other = cell(api, session, "'secret' in globals(), len(Out), _", "python:other")
    assert value(other) == "(False, 0, '')", "a new context starts empty: no variable, no Out, no _"
    assert cell(api, session, "mine = 2\nimport os\nos.chdir('/tmp')", "python:other")["status"] == "succeeded"
    assert value(cell(api, session, "secret, 'mine' in globals(), __import__('os').getcwd()", None)) == (
        "('default', False, '/workspace')"
    )
    assert value(cell(api, session, "mine, os.getcwd()", "python:other")) == "(2, '/tmp')"
    # The same files: what one context writes in the workspace the other reads.
    assert (
        cell(api, session, "open('/workspace/shared.txt', 'w').write('both')", "python:other")["status"] == "succeeded"
    )
    assert value(cell(api, session, "open('/workspace/shared.txt').read()", None)) == "'both'"


def test_a_javascript_context_keeps_its_declarations_and_names_its_errors(api: httpx.Client, session: str) -> None:
    assert value(cell(api, session, "const seen = [1, 2]; let total = 40; total + 2", "javascript")) == "42"
    printed = cell(api, session, "seen.push(3); console.log(seen.join(','), process.cwd()); seen.length", "javascript")
    assert value(printed) == "3" and printed["stdout"] == "1,2,3 /workspace\n", printed
    awaited = cell(api, session, "const n = await Promise.resolve(total); console.log('awaited', n)", "javascript")
    assert awaited["status"] == "succeeded" and awaited["stdout"] == "awaited 40\n", awaited
    promised = cell(api, session, "Promise.resolve(total * 2)", "javascript")
    assert value(promised) == "80", "a promise as the last value is waited for"

    failed = cell(api, session, "null.field", "javascript")
    assert failed["status"] == "failed", failed
    assert failed["error"]["category"] == "code.exception", failed["error"]
    assert failed["error"]["details"]["type"] == "TypeError", failed["error"]

    other = cell(api, session, "typeof seen", "javascript:other")
    assert value(other) == "'undefined'", "another JavaScript context is another process"
    python = cell(api, session, "'seen' in globals()", None)
    assert value(python) == "False"


def test_an_interrupted_javascript_cell_stops_and_its_context_lives_on(api: httpx.Client, session: str) -> None:
    assert value(cell(api, session, "let kept = 'still here'; kept", "javascript")) == "'still here'"
    spun = cell(api, session, "while (true) {}", "javascript", policy={"timeout_s": 2})
    assert spun["status"] == "failed" and spun["error"]["category"] == "limit.timeout", spun
    assert spun["kernel_restarted"] is False, "the loop stopped when interrupted: nothing was restarted"
    assert value(cell(api, session, "kept", "javascript")) == "'still here'"


def test_nothing_a_javascript_cell_set_going_runs_on_after_it(api: httpx.Client, session: str) -> None:
    started = cell(api, session, "globalThis.ticks = 0; setInterval(() => { ticks++; console.log('tick') }, 5); "
                                 "setTimeout(() => console.log('late'), 20); ticks", "javascript")  # fmt: skip
    assert value(started) == "0"
    later = cell(api, session, "await new Promise((done) => setTimeout(done, 200)); console.log(ticks)", "javascript")
    assert later["status"] == "succeeded" and later["stdout"] == "0\n", later


def test_a_bash_context_keeps_variables_functions_and_directory(api: httpx.Client, session: str) -> None:
    first = cell(api, session, 'count=1\ngreet() { echo "hi $1"; }\nmkdir -p sub && cd sub', "bash")
    assert first["status"] == "succeeded", first
    second = cell(api, session, "count=$((count + 1)); greet there; echo $count; pwd; echo $FROM_CELL", "bash",
                  env={"FROM_CELL": "given"})  # fmt: skip
    assert second["status"] == "succeeded", second
    assert second["stdout"] == "hi there\n2\n/home/user/sub\ngiven\n", second
    third = cell(api, session, "echo ${count:-unset} ${FROM_CELL:-gone}", "bash:other")
    assert third["stdout"] == "unset gone\n", "another shell context starts afresh"
    failed = cell(api, session, "exit 3", "bash")
    assert failed["status"] == "failed" and failed["error"]["details"]["exit_code"] == 3, failed


def test_contexts_are_refused_where_they_cannot_run(api: httpx.Client, session: str) -> None:
    lone = api.post("/v1/executions", json={"language": "python", "code": "1", "session_context": "python:x"})
    assert lone.status_code == 422, lone.text
    assert [e["field"] for e in lone.json()["errors"]] == ["session_context"], lone.text
    for bad in ("ruby", "python:", "python:UPPER", "javascript:" + "x" * 41, "python:../x"):
        response = api.post("/v1/executions", json={"language": "python", "code": "1", "session": session,
                                                     "session_context": bad})  # fmt: skip
        assert response.status_code == 422, (bad, response.text)
        assert [e["field"] for e in response.json()["errors"]] == ["session_context"], response.text

    slim = open_session(api, language="python@slim", idle_timeout_s=60)
    try:
        response = api.post("/v1/executions", json={"language": "python@slim", "code": "1", "session": slim["id"],
                                                    "session_context": "javascript"})  # fmt: skip
        assert response.status_code == 422, response.text
        assert [e["field"] for e in response.json()["errors"]] == ["session_context"], response.text
    finally:
        api.delete(f"/v1/sessions/{slim['id']}")
    listed = {lang["name"]: lang for lang in api.get("/v1/languages").json()["languages"]}
    assert listed["python"]["session_contexts"] == ["python", "javascript", "bash"]
    assert listed["python@slim"]["session_contexts"] == ["python", "bash"]
