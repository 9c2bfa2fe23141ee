"""Issue 44 (known, not yet fixed): admin routes answered 401 where 403 is meant. A tenant's valid API
key on any admin route is 403 `auth.not_admin` (who it is is known; the route is not its to call);
no key, an unknown key or a revoked one is 401 `auth.invalid_key`."""

from __future__ import annotations

import re

import pytest
import redis
from pydantic import SecretStr

from execbox.api import create_app
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
TOKEN = "an-admin-token-of-24-chars"


def admin_routes(http: InProcess) -> list[tuple[str, str]]:
    """Every admin route of the OpenAPI document, its path parameters filled with valid values."""
    filled = {"key_id": "0123abcd", "name": "shared.x", "version": "1.0.0", "node": "node-a"}
    return [
        (method.upper(), re.sub(r"\{(\w+)\}", lambda m: filled[m.group(1)], path))
        for path, operations in http.app.openapi()["paths"].items()
        if path.startswith("/v1/admin/")
        for method in operations
    ]


def test_a_tenant_key_on_every_admin_route_is_403_and_no_valid_key_is_401(
    settings: Settings, client: redis.Redis
) -> None:
    keys = ApiKeys(client, settings.redis.key_prefix)
    tenant_key, _ = keys.create("alpha")
    revoked_key, revoked = keys.create("alpha")
    keys.revoke(revoked.key_id)
    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": SecretStr(TOKEN)})})
    http = InProcess(create_app(admin))
    try:
        routes = admin_routes(http)
        answers = {
            (method, path, who): http.run(
                http.http.request(method, path, headers=headers)  # no body: refused before one is needed
            )
            for method, path in routes
            for who, headers in {
                "tenant": {"Authorization": f"Bearer {tenant_key}"},
                "none": {},
                "unknown": {"Authorization": "Bearer ebx_00000000_not-a-key"},
                "revoked": {"Authorization": f"Bearer {revoked_key}"},
            }.items()
        }
    finally:
        http.close()

    assert len(routes) >= 8, routes
    wrong = {
        k: (a.status_code, a.json().get("code"))
        for k, a in answers.items()
        if (a.status_code, a.json().get("code"))
        != ((403, "auth.not_admin") if k[2] == "tenant" else (401, "auth.invalid_key"))
    }
    assert wrong == {}
