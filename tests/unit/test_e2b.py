"""The E2B facade's pure parts (results and errors in E2B's shapes, the SDK's metadata filter) and
its refusals from the attacker's side: each is E2B's JSON with the field named, and stores nothing."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
import redis

from execbox.core import logs
from execbox.e2b.contexts import HOME, cwd_of
from execbox.e2b.envd import sandbox_path
from execbox.e2b.results import error_line, finished_lines, result_line
from execbox.e2b.sandboxes import metadata_filter
from execbox.executions.schemas import ExecutionError, ResultData, RichResult
from execbox.executions.status import ErrorCategory
from execbox.sandbox.runtime import WORKDIR
from execbox.settings import Settings
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]


def data(media_type: str, text: str | None = None, file: str = "r0.bin") -> ResultData:
    return ResultData(media_type=media_type, size=1, sha256="0" * 64, url=f"/v1/executions/exe_x/results/{file}",
                      text=text)  # fmt: skip


def test_a_result_carries_each_representation_under_e2bs_key_and_binary_ones_in_base64() -> None:
    stored = {"/v1/executions/exe_x/results/p.png": b"\x89PNG-bytes"}
    result = RichResult(kind="execute_result", data={
        "text/plain": data("text/plain", "42"),
        "image/png": data("image/png", file="p.png"),
        "application/json": data("application/json", '{"a": [1, 2]}'),
        "application/vnd.custom": data("application/vnd.custom", "custom"),
    })  # fmt: skip
    fields = json.loads(result_line(result, lambda d: stored[d.url]))
    assert fields["type"] == "result" and fields["is_main_result"] is True
    assert fields["text"] == "42" and base64.b64decode(fields["png"]) == b"\x89PNG-bytes"
    assert fields["json"] == {"a": [1, 2]} and fields["extra"] == {"application/vnd.custom": "custom"}


def test_a_raised_error_is_named_by_its_type_and_any_other_by_its_category() -> None:
    raised = ExecutionError(
        category=ErrorCategory.CODE_EXCEPTION,
        message="uncaught KeyError: 'k'",
        retryable=False,
        details={"type": "KeyError", "message": "'k'", "traceback": "Traceback ...\nKeyError: 'k'"},
    )
    limit = ExecutionError(category=ErrorCategory.LIMIT_TIMEOUT, message="ran past 30 s", retryable=False)
    assert json.loads(error_line(raised)) == {"type": "error", "name": "KeyError", "value": "'k'",
                                              "traceback": "Traceback ...\nKeyError: 'k'"}  # fmt: skip
    assert json.loads(error_line(limit)) == {"type": "error", "name": "limit.timeout", "value": "ran past 30 s",
                                             "traceback": ""}  # fmt: skip


def test_the_end_of_a_cell_is_its_results_error_count_and_end_mark_each_on_one_line() -> None:
    lines = list(finished_lines([], None, 7, lambda d: b""))
    assert [json.loads(x)["type"] for x in lines] == ["number_of_executions", "end_of_execution"]
    assert json.loads(lines[0])["execution_count"] == 7
    assert all(x.endswith(b"\n") and x.count(b"\n") == 1 and x.strip() for x in lines), "no blank line, ever"


def test_the_sdks_metadata_filter_is_decoded_to_what_the_user_wrote() -> None:
    # What the SDK sends for {"k": "v w", "x&y": "1=2"}, as the server sees it after one decoding.
    assert metadata_filter("k=v%2520w&x%2526y=1%253D2") == {"k": "v w", "x&y": "1=2"}
    assert metadata_filter("suite=e2b") == {"suite": "e2b"}
    assert metadata_filter(None) == {} and metadata_filter("") == {}


def test_a_context_starts_where_the_sandbox_keeps_its_files() -> None:
    assert sandbox_path(HOME) == WORKDIR
    assert cwd_of(None) == cwd_of("") == HOME
    assert cwd_of("data") == cwd_of("/workspace/data") == "/home/user/data", "relative: under the home, as files are"
    assert cwd_of("/tmp/../etc") == "/etc", "a context may start anywhere it can read; its cell then fails or not"


def keys_now(client: redis.Redis, settings: Settings) -> set[bytes]:
    return set(client.scan_iter(match=f"{settings.redis.key_prefix}:*"))


def create(api: Api, body: dict[str, Any], tenant: str | None = "alpha") -> tuple[int, dict[str, Any]]:
    http, headers = api
    key = headers[tenant]["Authorization"].removeprefix("Bearer ") if tenant else None
    answer = http.post("/e2b/v2/sandboxes", json=body, headers={"X-API-KEY": key} if key else {})
    return answer.status_code, answer.json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"templateID": "no-such"}, "templateID"),
        ({"templateID": "base", "autoPause": True}, "autoPause"),
        ({"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}, "volumeMounts"),
        ({"templateID": "base", "allow_internet_access": True}, "allow_internet_access"),
        ({"templateID": "base", "timeout": 10**9}, "timeout"),
        ({"templateID": "base", "timeout": 0}, "timeout"),
        ({"templateID": "base", "metadata": {"execbox.owner": "me"}}, "metadata"),
        ({"templateID": "base", "metadata": {"x": "y" * 300}}, "metadata"),
        ({"templateID": "base", "envVars": {"A": 1}}, "envVars"),
        ({"templateID": "x" * 500}, "templateID"),
    ],
)
def test_a_sandbox_that_cannot_be_made_is_refused_naming_the_field_and_stores_nothing(
    api: Api, client: redis.Redis, settings: Settings, body: dict[str, Any], field: str
) -> None:
    before = keys_now(client, settings)
    status, answer = create(api, body)
    assert status == 400 and answer["code"] == 400 and field in answer["message"], answer
    assert keys_now(client, settings) == before


def test_the_control_plane_wants_a_valid_key_and_answers_e2bs_error_shape(api: Api) -> None:
    status, answer = create(api, {"templateID": "base"}, tenant=None)
    assert status == 401 and set(answer) == {"code", "message"}, answer
    http, _ = api
    forged = http.post("/e2b/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": "ebx_0_guess"})
    assert forged.status_code == 401 and forged.json()["code"] == 401


@pytest.mark.parametrize("sandbox_id", ["0" * 26, "ses_" + "a" * 26, "x" * 5000, "%00", "*"])
def test_a_sandbox_id_that_is_not_the_tenants_is_not_found_whatever_it_spells(api: Api, sandbox_id: str) -> None:
    http, headers = api
    key = {"X-API-KEY": headers["alpha"]["Authorization"].removeprefix("Bearer ")}
    for answer in (http.get(f"/e2b/sandboxes/{sandbox_id}", headers=key),
                   http.delete(f"/e2b/sandboxes/{sandbox_id}", headers=key),
                   http.post(f"/e2b/sandboxes/{sandbox_id}/timeout", json={"timeout": 5}, headers=key),
                   http.post(f"/e2b/v2/sandboxes/{sandbox_id}/connect", json={}, headers=key)):  # fmt: skip
        assert answer.status_code == 404 and answer.json()["code"] == 404, answer.text


@pytest.mark.parametrize(
    "headers",
    [{}, {"E2b-Sandbox-Id": "0" * 26}, {"X-Access-Token": "t"}, {"E2b-Sandbox-Id": "0" * 26, "X-Access-Token": "t"},
     {"E2b-Sandbox-Id": "x" * 100, "E2B-Traffic-Access-Token": "t"}],
)  # fmt: skip
def test_an_in_sandbox_call_without_the_sandboxs_token_is_refused_alike(api: Api, headers: dict[str, str]) -> None:
    http, _ = api
    answers = [http.get("/e2b/sandbox/health", headers=headers),
               http.post("/e2b/sandbox/execute", json={"code": "1"}, headers=headers),
               http.get("/e2b/sandbox/contexts", headers=headers)]  # fmt: skip
    assert {a.status_code for a in answers} == {401}, [a.text for a in answers]
    rpc = http.post("/e2b/sandbox/process.Process/Start", content=b"", headers=headers)
    assert rpc.status_code == 401 and rpc.json()["code"] == "unauthenticated", rpc.text


def test_a_connection_cut_on_purpose_is_logged_as_one_info_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("INFO", "api")
    try:
        raise logs.CutConnection("sandbox x ended under cell exe_y")
    except logs.CutConnection:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    (line,) = [json.loads(x) for x in capsys.readouterr().err.splitlines() if "uvicorn.error" in x]
    assert line["level"] == "INFO" and "exc_info" not in line, line
    assert line["message"] == "connection cut on purpose: sandbox x ended under cell exe_y"
