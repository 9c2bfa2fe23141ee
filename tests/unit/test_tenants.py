"""API keys and tenants through the API of the in-process stack (tests/unit/stack.py): no valid key,
no answer; the admin endpoint issues and revokes keys; keys are stored hashed. Moved from
tests/integration/test_tenants.py (issue 45), which keeps the cross-tenant isolation test on the
real deployment (a real program's artifact, a real worker)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.conftest import Redis, auth
from tests.unit.stack import InStack, in_stack

pytestmark = pytest.mark.redis
ADMIN = "test-admin-token-0123456789"


def test_requests_without_a_valid_key_are_401(inproc: InStack) -> None:
    inproc.key("alpha")  # a tenant with a key exists: the refusals are of these requests' keys
    with inproc.client(tenant=None) as anonymous:
        for response in (
            anonymous.get("/v1/languages"),
            anonymous.post("/v1/executions", json={"language": "python", "code": "print(1)"}),
            anonymous.get("/v1/executions/exe_" + "a" * 26, headers=auth("ebx_00000000_forged")),
            anonymous.post("/v1/files", files={"file": ("a", b"x")}, headers={"Authorization": "Basic eDp5"}),
        ):
            assert response.status_code == 401, response.text
            assert response.json()["code"] == "auth.invalid_key"
        assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/metrics").status_code == 200
    assert inproc.redis.llen(f"rq:queue:{inproc.settings.queue.name}") == 0


def test_admin_endpoint_issues_and_revokes_keys(redis_server: Redis, tmp_path: Path) -> None:
    # SecretStr as the settings would parse EXECBOX_AUTH__ADMIN_TOKEN (the stack's updates are not validated).
    with in_stack(redis_server, tmp_path, auth={"admin_token": SecretStr(ADMIN)}) as inproc:
        with inproc.client(tenant=None) as http:
            assert http.post("/v1/admin/keys", json={"tenant": "gamma"}, headers=auth("wrong")).status_code == 401
            issued = http.post("/v1/admin/keys", json={"tenant": "gamma"}, headers=auth(ADMIN))
            assert issued.status_code == 201, issued.text
            key, key_id = issued.json()["key"], issued.json()["key_id"]
            assert http.get("/v1/languages", headers=auth(key)).status_code == 200
            listed = http.get("/v1/admin/keys", headers=auth(ADMIN)).json()
            assert any(k["key_id"] == key_id and k["key"] is None for k in listed)  # never shown again
            assert http.delete(f"/v1/admin/keys/{key_id}", headers=auth(ADMIN)).status_code == 204
            assert http.get("/v1/languages", headers=auth(key)).status_code == 401
    with in_stack(redis_server, tmp_path) as inproc, inproc.client() as client:
        # no admin token configured: the endpoints do not exist
        assert client.get("/v1/admin/keys", headers=auth("anything")).status_code == 404


def test_keys_are_stored_hashed(inproc: InStack) -> None:
    keys = [inproc.key(tenant) for tenant in ("alpha", "beta")]
    with inproc.client("alpha") as alpha:
        assert alpha.get("/v1/languages").status_code == 200  # the stored form still authenticates
    stored = list(inproc.redis.scan_iter(match=f"{inproc.settings.redis.key_prefix}:apikey*", count=1000))
    dump = b"".join((inproc.redis.get(k) or b"") + k for k in stored if inproc.redis.type(k) == b"string")
    assert dump, stored  # the keys are there, in some form
    for key in keys:
        assert key.encode() not in dump and base64.b64encode(key.encode()) not in dump
