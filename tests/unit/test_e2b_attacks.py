"""The E2B facade from the attacker's side, in-process: hostile bodies, headers, queries and tokens
on every /e2b route. The contract under test: a bad input gets a clear 4xx in E2B's error shape
(`{"code", "message"}`) naming the field, never a 500 or a hang, and stores nothing; one tenant
never sees or reaches another's sandbox; a token opens only its own sandbox, and only the newest
16 tokens of a sandbox open it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import httpx
import pytest
import redis

from execbox.settings import Settings
from execbox.worker.reaper import report_health
from tests.conftest import wait_until
from tests.unit.conftest import InProcess
from tests.unit.stack import FakeWorker as Worker

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]
CREATE = "/e2b/v2/sandboxes"
MISSING = "<the field left out>"


# helpers
def keys_now(client: redis.Redis, settings: Settings) -> set[bytes]:
    return set(client.scan_iter(match=f"{settings.redis.key_prefix}:*"))


def api_key(api: Api, tenant: str) -> dict[str, str]:
    return {"X-API-KEY": api[1][tenant]["Authorization"].removeprefix("Bearer ")}


def send(http: InProcess, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request; an exception the app let out counts as the 500 a server would have answered."""
    try:
        return http.run(http.http.request(method, url, **kwargs))
    except (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeEncodeError):
        raise  # the client could not send it: the test's own mistake, not the app's
    except Exception as exc:  # the app's unhandled error is what the test reports
        return httpx.Response(500, json={"unhandled": repr(exc)})


def e2b_error(answer: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """Assert E2B's control-plane error: the status, `{"code": status, "message"}`, the field named."""
    assert answer.status_code == status, (answer.status_code, answer.text)
    body = answer.json()
    assert isinstance(body, dict) and body.get("code") == status and isinstance(body.get("message"), str), body
    if field is not None:
        assert field in body["message"], body
    return body


@pytest.fixture
def host(api: Api, worker: Worker) -> Iterator[Worker]:
    """The fleet's session slots (a worker's heartbeat) and a session host holding the sandboxes."""
    with worker.hosting_sessions():
        yield worker


def make(api: Api, tenant: str = "alpha", **fields: Any) -> dict[str, Any]:
    answer = api[0].post(CREATE, json={"templateID": "base", **fields}, headers=api_key(api, tenant))
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    session = f"/v1/sessions/ses_{created['sandboxID']}"
    wait_until(lambda: api[0].get(session, headers=api[1][tenant]).json()["status"] == "ready", 10, "the sandbox")
    return created


def plane(sandbox_id: str, token: str, header: str = "X-Access-Token") -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox_id, header: token}


# the control plane: bodies
@pytest.mark.parametrize(
    "raw",
    [b"not json", b"{", b"[]", b'[{"templateID": "base"}]', b"null", b'"base"', b"42", b"\xff\xfe\x00",
     b'{"templateID": "base"', b""],
)  # fmt: skip
def test_a_create_body_that_is_not_a_json_object_is_400_in_e2bs_shape_and_stores_nothing(
    api: Api, client: redis.Redis, settings: Settings, raw: bytes
) -> None:
    before = keys_now(client, settings)
    headers = {**api_key(api, "alpha"), "Content-Type": "application/json"}
    e2b_error(send(api[0], "POST", CREATE, content=raw, headers=headers), 400)
    assert keys_now(client, settings) == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"templateID": "base\x00"}, "templateID"),
        ({"templateID": "b\u0430se"}, "templateID"),  # a Cyrillic a
        ({"templateID": "\u202eesab"}, "templateID"),
        ({"templateID": "x" * 1_000_000}, "templateID"),
        ({"templateID": ""}, "templateID"),
        ({"templateID": None}, "templateID"),
        ({"templateID": ["base"]}, "templateID"),
        ({"templateID": MISSING}, "templateID"),
        ({"timeout": 5.5}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": 10**400}, "timeout"),
        ({"timeout": 1e300}, "timeout"),
        ({"timeout": 86401}, "timeout"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"": "v"}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"EXECBOX.x": "v"}}, "metadata"),
        ({"metadata": ["k", "v"]}, "metadata"),
        ({"metadata": {"k": {"nested": 1}}}, "metadata"),
        ({"envVars": "A=1"}, "envVars"),
        ({"envVars": {"A": None}}, "envVars"),
        ({"network": {"allowOut": ["0.0.0.0/0"]}}, "network"),
        ({"mcp": {}}, "mcp"),
        ({"lifecycle": {"onTimeout": "pause"}}, "lifecycle"),
        ({"allow_internet_access": "yes please"}, "allow_internet_access"),
    ],
)
def test_a_hostile_create_field_is_400_naming_it_and_stores_nothing(
    api: Api, worker: Worker, client: redis.Redis, settings: Settings, fields: dict[str, Any], field: str
) -> None:
    report_health(worker.ctx)  # slots exist: a refusal is the field's, not the fleet's
    body = {name: value for name, value in {"templateID": "base", **fields}.items() if value != MISSING}
    before = keys_now(client, settings)
    answer = send(api[0], "POST", CREATE, json=body, headers=api_key(api, "alpha"))
    e2b_error(answer, 400, field)
    assert keys_now(client, settings) == before


@pytest.mark.parametrize(
    "env", [{"A=B": "1"}, {"": "1"}, {"EXECBOX_TOKEN": "x"}, {"A": "x\x00y"}, {"1A": "x"}, {"A": "x" * 5000}]
)
def test_create_envvars_that_a_cell_would_refuse_are_400_naming_envvars_and_store_nothing(
    api: Api, worker: Worker, client: redis.Redis, settings: Settings, env: dict[str, str]
) -> None:
    report_health(worker.ctx)
    before = keys_now(client, settings)
    answer = send(api[0], "POST", CREATE, json={"templateID": "base", "envVars": env}, headers=api_key(api, "alpha"))
    e2b_error(answer, 400, "envVars")
    assert keys_now(client, settings) == before


def test_a_create_body_above_the_json_cap_is_413_in_e2bs_shape_and_stores_nothing(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    before = keys_now(client, settings)
    body = {"templateID": "base", "metadata": {"k": "v" * (settings.api.max_json_body_bytes + 10)}}
    e2b_error(send(api[0], "POST", CREATE, json=body, headers=api_key(api, "alpha")), 413)
    assert keys_now(client, settings) == before


# the control plane: the key
@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer {key}"},
        {"X-API-KEY": "Bearer {key}"},
        {"X-API-KEY": ""},
        {"X-API-KEY": "{key}x"},
        {"X-API-KEY": "x" * 100_000},
        {"X-API-KEY": "\u00e9{key}"},
    ],
)
def test_the_control_plane_opens_only_to_the_exact_key_in_x_api_key(
    api: Api, client: redis.Redis, settings: Settings, headers: dict[str, str]
) -> None:
    key = api_key(api, "alpha")["X-API-KEY"]
    sent = {name: value.replace("{key}", key).encode("latin-1") for name, value in headers.items()}
    before = keys_now(client, settings)
    for method, url in (("POST", CREATE), ("GET", CREATE), ("GET", "/e2b/sandboxes/" + "a" * 26)):
        answer = send(api[0], method, url, json={"templateID": "base"} if method == "POST" else None, headers=sent)
        e2b_error(answer, 401)
    assert keys_now(client, settings) == before


# the control plane: list
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=1001", "limit"),
        ("limit=abc", "limit"),
        ("limit=1e3", "limit"),
        ("limit=99999999999999999999999999", "limit"),
        ("nextToken=-1", "nextToken"),
        ("nextToken=abc", "nextToken"),
        ("nextToken=1234567890", "nextToken"),
        ("nextToken=%201", "nextToken"),
        ("nextToken=1%00", "nextToken"),
        ("metadata=" + "%26".join(["k"] * 10_000), "metadata"),  # 10k pairs in 40 kB (httpx sends up to 64 kB)
    ],
)
def test_a_hostile_list_query_is_400_naming_the_parameter(api: Api, query: str, field: str) -> None:
    e2b_error(send(api[0], "GET", f"{CREATE}?{query}", headers=api_key(api, "alpha")), 400, field)


@pytest.mark.parametrize(
    "metadata",
    ["%", "%zz%3D%", "%E0%A4%A%3D1", "%00%3D%00", "=", "&&&", "a%3D%2525", "%F0%9F%92%A9%3D%F0%9F%92%A9",
     "%26".join(f"k{i}%3Dv" for i in range(1000))],
)  # fmt: skip
def test_a_malformed_metadata_filter_answers_an_empty_list_or_400_never_500(api: Api, metadata: str) -> None:
    answer = send(api[0], "GET", f"{CREATE}?metadata={metadata}", headers=api_key(api, "alpha"))
    if answer.status_code == 200:
        assert answer.json() == [], answer.text
    else:
        e2b_error(answer, 400, "metadata")


def test_paging_past_the_end_answers_an_empty_page_without_a_next_token(api: Api, host: Worker) -> None:
    for _ in range(2):  # the tenant's share of the fleet's four slots
        make(api)
    page = send(api[0], "GET", f"{CREATE}?limit=1", headers=api_key(api, "alpha"))
    assert page.status_code == 200 and len(page.json()) == 1 and page.headers["x-next-token"] == "1", page.text
    last = send(api[0], "GET", f"{CREATE}?limit=1&nextToken=1", headers=api_key(api, "alpha"))
    assert last.status_code == 200 and len(last.json()) == 1 and "x-next-token" not in last.headers, last.text
    beyond = send(api[0], "GET", f"{CREATE}?nextToken=999999999&limit=1000", headers=api_key(api, "alpha"))
    assert beyond.status_code == 200 and beyond.json() == [] and "x-next-token" not in beyond.headers


# tenants
def test_another_tenant_neither_lists_reads_connects_times_out_nor_kills_a_sandbox(
    api: Api, host: Worker, client: redis.Redis, settings: Settings
) -> None:
    http = api[0]
    mine = make(api, metadata={"owner": "alpha"})
    sid, beta = mine["sandboxID"], api_key(api, "beta")
    before = keys_now(client, settings)
    e2b_error(send(http, "GET", f"/e2b/sandboxes/{sid}", headers=beta), 404)
    e2b_error(send(http, "POST", f"/e2b/v2/sandboxes/{sid}/connect", json={}, headers=beta), 404)
    e2b_error(send(http, "POST", f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 1}, headers=beta), 404)
    e2b_error(send(http, "DELETE", f"/e2b/sandboxes/{sid}", headers=beta), 404)
    listed = send(http, "GET", f"{CREATE}?metadata=owner%3Dalpha", headers=beta)
    assert listed.status_code == 200 and listed.json() == [], listed.text
    assert keys_now(client, settings) == before
    # still running, with the lifetime it had
    detail = send(http, "GET", f"/e2b/sandboxes/{sid}", headers=api_key(api, "alpha"))
    assert detail.status_code == 200, detail.text
    session = http.get(f"/v1/sessions/ses_{sid}", headers=api[1]["alpha"]).json()
    assert session["status"] != "ended" and session["max_lifetime_s"] == 300, session
    assert send(http, "GET", "/e2b/sandbox/health", headers=plane(sid, mine["envdAccessToken"])).status_code == 204


def test_the_native_api_of_another_tenant_does_not_reach_a_sandboxs_session(api: Api, host: Worker) -> None:
    http, headers = api
    sid = make(api)["sandboxID"]
    assert http.get(f"/v1/sessions/ses_{sid}", headers=headers["beta"]).status_code == 404
    assert http.delete(f"/v1/sessions/ses_{sid}", headers=headers["beta"]).status_code == 404
    assert send(http, "GET", f"/e2b/sandboxes/{sid}", headers=api_key(api, "alpha")).status_code == 200


# tokens
def test_a_token_opens_only_its_own_sandbox_whatever_the_tenant_or_header(api: Api, host: Worker) -> None:
    http = api[0]
    a, b, c = make(api), make(api), make(api, "beta")
    token_a = a["envdAccessToken"]
    for target in (b, c):
        for header in ("X-Access-Token", "E2B-Traffic-Access-Token"):
            for method, url, body in (("GET", "/e2b/sandbox/health", None), ("GET", "/e2b/sandbox/contexts", None),
                                      ("POST", "/e2b/sandbox/execute", {"code": "print(1)"}),
                                      ("POST", "/e2b/sandbox/process.Process/List", {})):  # fmt: skip
                answer = send(http, method, url, json=body, headers=plane(target["sandboxID"], token_a, header))
                assert answer.status_code == 401, (url, header, answer.text)
    # B's and C's own tokens still open them
    for target in (b, c):
        own = plane(target["sandboxID"], target["envdAccessToken"])
        assert send(http, "GET", "/e2b/sandbox/health", headers=own).status_code == 204


def test_the_traffic_token_header_alone_opens_the_sandbox_the_sdk_sends_it_to(api: Api, host: Worker) -> None:
    """The SDK sends only E2B-Traffic-Access-Token on /contexts (PROTOCOL.md section 8)."""
    http = api[0]
    sbx = make(api)
    answer = send(http, "GET", "/e2b/sandbox/contexts", headers=plane(sbx["sandboxID"], sbx["trafficAccessToken"],
                                                                      "E2B-Traffic-Access-Token"))  # fmt: skip
    assert answer.status_code == 200 and answer.json()[0]["id"] == "python", answer.text
    forged = plane(sbx["sandboxID"], sbx["trafficAccessToken"][:-1], "E2B-Traffic-Access-Token")
    assert send(http, "GET", "/e2b/sandbox/contexts", headers=forged).status_code == 401


def test_after_100_connects_the_creators_token_and_the_newest_15_open_the_sandbox(
    api: Api, host: Worker, client: redis.Redis, settings: Settings
) -> None:
    """Issue 44: the 17th connect evicted the creator's token (its SDK object lost the sandbox)."""
    http = api[0]
    sbx = make(api)
    sid = sbx["sandboxID"]
    tokens = [sbx["envdAccessToken"]]
    for _ in range(100):
        answer = send(http, "POST", f"/e2b/v2/sandboxes/{sid}/connect", json={}, headers=api_key(api, "alpha"))
        assert answer.status_code == 200, answer.text
        tokens.append(answer.json()["envdAccessToken"])
    assert len(set(tokens)) == 101, "every connect hands out a fresh token"
    for token in [tokens[0], *tokens[-15:]]:
        assert send(http, "GET", "/e2b/sandbox/health", headers=plane(sid, token)).status_code == 204
    for token in (tokens[-16], tokens[1], tokens[16], tokens[50]):  # 16th-newest, first connect's, 17th-oldest, any
        answer = send(http, "GET", "/e2b/sandbox/health", headers=plane(sid, token))
        assert answer.status_code == 401 and answer.json()["code"] == 401, answer.text
    stored = client.get(f"{settings.redis.key_prefix}:e2b:ses_{sid}")
    assert stored is not None and len(json.loads(stored)["tokens"]) == 16, "at most 16 digests are kept"


@pytest.mark.parametrize(
    "body", [{"timeout": 0}, {"timeout": -5}, {"timeout": 5.5}, {"timeout": "x"}, {"timeout": 86401}, [1]]
)
def test_a_hostile_connect_body_is_400_and_adds_no_token(
    api: Api, host: Worker, client: redis.Redis, settings: Settings, body: Any
) -> None:
    sbx = make(api)
    before = client.get(f"{settings.redis.key_prefix}:e2b:ses_{sbx['sandboxID']}")
    url = f"/e2b/v2/sandboxes/{sbx['sandboxID']}/connect"
    e2b_error(send(api[0], "POST", url, json=body, headers=api_key(api, "alpha")), 400)
    assert client.get(f"{settings.redis.key_prefix}:e2b:ses_{sbx['sandboxID']}") == before


@pytest.mark.parametrize("route", ["connect", "timeout"])
def test_an_astronomical_timeout_on_connect_or_set_timeout_is_400_naming_timeout(
    api: Api, host: Worker, route: str
) -> None:
    sid = make(api)["sandboxID"]
    url = f"/e2b/v2/sandboxes/{sid}/connect" if route == "connect" else f"/e2b/sandboxes/{sid}/timeout"
    e2b_error(send(api[0], "POST", url, json={"timeout": 10**400}, headers=api_key(api, "alpha")), 400, "timeout")


@pytest.mark.parametrize(
    ("body", "field"),
    [({"timeout": 86401}, "timeout"), ({"timeout": 10**12}, "timeout"), ({"timeout": 0}, "timeout"),
     ({"timeout": -1}, "timeout"), ({"timeout": 1.5}, "timeout"), ({"timeout": "60"[::-1] + "s"}, "timeout"),
     ({}, "timeout"), ([60], None), (None, None)],
)  # fmt: skip
def test_set_timeout_refused_is_400_and_leaves_the_sessions_lifetime_unchanged(
    api: Api, host: Worker, body: Any, field: str | None
) -> None:
    http = api[0]
    sid = make(api, timeout=120)["sandboxID"]
    before = http.get(f"/v1/sessions/ses_{sid}", headers=api[1]["alpha"]).json()
    answer = send(http, "POST", f"/e2b/sandboxes/{sid}/timeout", json=body, headers=api_key(api, "alpha"))
    e2b_error(answer, 400, field)
    after = http.get(f"/v1/sessions/ses_{sid}", headers=api[1]["alpha"]).json()
    assert after["max_lifetime_s"] == before["max_lifetime_s"] == 120, after
    assert after["expires_at"] == before["expires_at"], after


# the sandbox plane: /execute and contexts
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"code": "1", "language": "r"}, 400, "language"),
        ({"code": "1", "language": "bash", "context_id": "python"}, 400, "language"),
        ({"code": "1", "language": "python\x00"}, 400, "language"),
        ({"code": "1", "context_id": "another"}, 404, "another"),
        ({"code": "1", "context_id": "x" * 100_000}, 404, None),
        ({"code": "1", "env_vars": {"A=B": "1"}}, 400, "env_vars"),
        ({"code": "1", "env_vars": {"": "1"}}, 400, "env_vars"),
        ({"code": "1", "env_vars": {"EXECBOX_X": "1"}}, 400, "env_vars"),
        ({"code": "1", "env_vars": {"A": "x\x00"}}, 400, "env_vars"),
        ({"code": "1", "env_vars": {f"V{i}": "1" for i in range(65)}}, 400, "env_vars"),
        ({"code": "1", "env_vars": ["A"]}, 400, "env_vars"),
        ({"code": ""}, 400, "code"),
        ({"code": "   \n"}, 400, "code"),
        ({"code": None}, 400, "code"),
        ({"code": 1}, 400, "code"),
        ({}, 400, "code"),
        ([{"code": "1"}], 400, None),
    ],
)
def test_a_hostile_cell_is_refused_naming_the_field_and_stores_nothing(
    api: Api, host: Worker, client: redis.Redis, settings: Settings, body: Any, status: int, field: str | None
) -> None:
    sbx = make(api)
    before = keys_now(client, settings)
    answer = send(api[0], "POST", "/e2b/sandbox/execute", json=body, headers=plane(sbx["sandboxID"],
                                                                                   sbx["envdAccessToken"]))  # fmt: skip
    e2b_error(answer, status, field)
    assert keys_now(client, settings) == before
    session = api[0].get(f"/v1/sessions/ses_{sbx['sandboxID']}", headers=api[1]["alpha"]).json()
    assert session["executions"] == 0, session


@pytest.mark.parametrize("raw", [b"not json", b"{", b"\xff", b""])
def test_an_execute_body_that_is_not_json_is_400(api: Api, host: Worker, raw: bytes) -> None:
    sbx = make(api)
    headers = {**plane(sbx["sandboxID"], sbx["envdAccessToken"]), "Content-Type": "application/json"}
    e2b_error(send(api[0], "POST", "/e2b/sandbox/execute", content=raw, headers=headers), 400)


def test_contexts_a_sandbox_cannot_have_are_refused_at_once(api: Api, host: Worker) -> None:
    http = api[0]
    sbx = make(api)
    own = plane(sbx["sandboxID"], sbx["envdAccessToken"])
    for body in ({"language": "r"}, {"language": "typescript"}, {"language": "x" * 5000}, {"cwd": "rel\x00"}):
        e2b_error(send(http, "POST", "/e2b/sandbox/contexts", json=body, headers=own), 400)
    for context_id in ("z" * 5000, "python-0000000000", "ruby", "python-..%2F..%2Fx"):
        e2b_error(send(http, "DELETE", f"/e2b/sandbox/contexts/{context_id}", headers=own), 404)
        e2b_error(send(http, "POST", f"/e2b/sandbox/contexts/{context_id}/restart", headers=own), 404)
    made = [send(http, "POST", "/e2b/sandbox/contexts", json={"language": "js"}, headers=own) for _ in range(8)]
    assert [m.status_code for m in made] == [200] * 8, [m.text for m in made]
    e2b_error(send(http, "POST", "/e2b/sandbox/contexts", json={}, headers=own), 409)
    listed = send(http, "GET", "/e2b/sandbox/contexts", headers=own).json()
    assert len(listed) == 3 + 8 and {m.json()["id"] for m in made} <= {c["id"] for c in listed}


# an ended sandbox
def test_a_killed_sandbox_answers_not_found_on_the_control_plane_and_502_on_the_sandbox_plane(
    api: Api, host: Worker
) -> None:
    http = api[0]
    sbx = make(api)
    sid, key = sbx["sandboxID"], api_key(api, "alpha")
    assert send(http, "DELETE", f"/e2b/sandboxes/{sid}", headers=key).status_code == 204
    e2b_error(send(http, "DELETE", f"/e2b/sandboxes/{sid}", headers=key), 404)
    e2b_error(send(http, "GET", f"/e2b/sandboxes/{sid}", headers=key), 404)
    e2b_error(send(http, "POST", f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 60}, headers=key), 404)
    e2b_error(send(http, "POST", f"/e2b/v2/sandboxes/{sid}/connect", json={}, headers=key), 404)
    assert sid not in [s["sandboxID"] for s in send(http, "GET", CREATE, headers=key).json()]
    own = plane(sid, sbx["envdAccessToken"])
    for method, url, body in (("GET", "/e2b/sandbox/health", None), ("GET", "/e2b/sandbox/contexts", None),
                              ("POST", "/e2b/sandbox/execute", {"code": "print(1)"}),
                              ("POST", "/e2b/sandbox/contexts", {}),
                              ("GET", "/e2b/sandbox/files?path=/x", None)):  # fmt: skip
        answer = send(http, method, url, json=body, headers=own)
        assert answer.status_code == 502 and answer.json()["code"] == 502, (url, answer.text)
        assert "was not found" in answer.json()["message"]
    rpc = send(http, "POST", "/e2b/sandbox/process.Process/Start", json={}, headers=own)
    assert rpc.status_code == 502 and rpc.json()["code"] == "unavailable", rpc.text
    # a killed sandbox's token opens nothing else, and a stranger learns nothing from it
    e2b_error(send(http, "GET", "/e2b/sandbox/health", headers=plane(sid, "x")), 401)


# routes and methods
@pytest.mark.parametrize(
    ("method", "url"),
    [("GET", "/e2b/sandbox/execute"), ("PUT", CREATE), ("PATCH", "/e2b/sandboxes/" + "a" * 26),
     ("GET", "/e2b/sandbox/process.Process/Start"), ("GET", "/e2b/sandboxes/" + "a" * 26 + "/timeout")],
)  # fmt: skip
def test_a_method_a_route_does_not_take_is_405_in_e2bs_shape(api: Api, method: str, url: str) -> None:
    answer = send(api[0], method, url, headers=api_key(api, "alpha"))
    if "process.Process" in url:  # an RPC path answers Connect's code, a name
        assert answer.status_code == 405 and answer.json() == {"code": "unimplemented", "message": ANY}, answer.text
    else:
        e2b_error(answer, 405)


@pytest.mark.parametrize(
    ("method", "url"),
    [("GET", "/e2b/sandbox/execute"), ("PUT", CREATE), ("GET", "/e2b/sandbox/process.Process/Start"),
     ("POST", "/e2b/sandbox/a/b/c"), ("GET", "/e2b/v2/sandboxes/x/y/z")],
)  # fmt: skip
def test_method_and_route_confusion_is_a_4xx_never_a_500(api: Api, method: str, url: str) -> None:
    answer = send(api[0], method, url, headers=api_key(api, "alpha"))
    assert answer.status_code in (404, 405), answer.text


def test_an_unknown_rpc_service_needs_the_token_first_and_then_is_unimplemented(api: Api, host: Worker) -> None:
    http = api[0]
    sbx = make(api)
    stranger = send(http, "POST", "/e2b/sandbox/evil.Service/Do", json={}, headers=plane(sbx["sandboxID"], "x"))
    assert stranger.status_code == 401, stranger.text
    own = plane(sbx["sandboxID"], sbx["envdAccessToken"])
    answer = send(http, "POST", "/e2b/sandbox/" + "s" * 5000 + "/m", json={}, headers=own)
    assert answer.status_code == 501 and len(answer.json()["message"]) < 500, answer.text
