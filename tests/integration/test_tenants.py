"""API keys and tenants: nothing of one tenant is visible to another, over every endpoint."""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import Side, Stack, auth, run_code

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def test_tenant_b_sees_nothing_of_tenant_a(stack: Stack) -> None:
    with stack.client("alpha") as alpha, stack.client("beta") as beta:
        done = run_code(alpha, "import execbox\nopen(execbox.output_dir + '/secret.txt', 'w').write('alpha only')")
        url = done["artifacts"][0]["url"]
        uploaded = alpha.post("/v1/files", files={"file": ("a.txt", b"alpha data")}).json()
        queued = alpha.post("/v1/executions", json={"language": "python", "code": "import time\ntime.sleep(20)"})
        exe = done["id"]
        for response in (
            beta.get(f"/v1/executions/{exe}"),
            beta.get(f"/v1/executions/{exe}?wait=1"),
            beta.get(f"/v1/executions/{exe}/record"),
            beta.get(url),
            beta.post(f"/v1/executions/{queued.json()['id']}/cancel"),
            beta.get(f"/v1/files/{uploaded['id']}"),
        ):
            assert response.status_code == 404, (response.request.url, response.text)
            assert response.json()["code"] in {"execution.not_found", "file.not_found"}
        stolen = beta.post(
            "/v1/executions",
            json={
                "language": "python",
                "code": "print(open('x').read())",
                "files": [{"path": "x", "file_id": uploaded["id"]}],
            },
        )
        assert stolen.status_code == 422 and "files.0.file_id" in {e["field"] for e in stolen.json()["errors"]}
        # The same idempotency key in two tenants names two different executions.
        body = {"language": "python", "code": "print(1)"}
        a = alpha.post("/v1/executions", json=body, headers={"Idempotency-Key": "shared"}).json()["id"]
        b = beta.post("/v1/executions", json=body, headers={"Idempotency-Key": "shared"}).json()["id"]
        assert a != b
        # Tenant A still sees all of its own.
        assert alpha.get(url).content == b"alpha only"
        assert alpha.post(f"/v1/executions/{queued.json()['id']}/cancel").status_code in (200, 202)


def test_requests_without_a_valid_key_are_401(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=30) as anonymous:
        for response in (
            anonymous.get("/v1/languages"),
            anonymous.post("/v1/executions", json={"language": "python", "code": "print(1)"}),
            anonymous.get("/v1/executions/exe_" + "a" * 26, headers=auth("ebx_00000000_forged")),
            anonymous.post("/v1/files", files={"file": ("a", b"x")}, headers={"Authorization": "Basic eDp5"}),
        ):
            assert response.status_code == 401, response.text
            assert response.json()["code"] == "auth.invalid_key"
        assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/metrics").status_code == 200


def test_admin_endpoint_issues_and_revokes_keys(side_stack: Callable[..., Side]) -> None:
    side = side_stack(EXECBOX_AUTH__ADMIN_TOKEN="test-admin-token-0123456789")
    with httpx.Client(base_url=side.base_url, timeout=30) as http:
        assert http.post("/v1/admin/keys", json={"tenant": "gamma"}, headers=auth("wrong")).status_code == 401
        issued = http.post("/v1/admin/keys", json={"tenant": "gamma"}, headers=auth("test-admin-token-0123456789"))
        assert issued.status_code == 201
        key, key_id = issued.json()["key"], issued.json()["key_id"]
        assert http.get("/v1/languages", headers=auth(key)).status_code == 200
        listed = http.get("/v1/admin/keys", headers=auth("test-admin-token-0123456789")).json()
        assert any(k["key_id"] == key_id and k["key"] is None for k in listed)  # never shown again
        assert http.delete(f"/v1/admin/keys/{key_id}", headers=auth("test-admin-token-0123456789")).status_code == 204
        assert http.get("/v1/languages", headers=auth(key)).status_code == 401
    with side_stack().client() as client:  # no admin token configured: the endpoints do not exist
        assert client.get("/v1/admin/keys", headers=auth("anything")).status_code == 404


def test_keys_are_stored_hashed(stack: Stack) -> None:
    import redis

    client = redis.Redis.from_url(stack.env["EXECBOX_REDIS__URL"])
    dump = b"".join(
        (client.get(k) or b"") + k for k in client.scan_iter(match=f"{stack.prefix}:apikey*", count=1000)
        if client.type(k) == b"string"
    )  # fmt: skip
    for key in stack.keys.values():
        assert key.encode() not in dump and base64.b64encode(key.encode()) not in dump
