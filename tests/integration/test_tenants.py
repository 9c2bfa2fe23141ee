"""Tenants end to end: nothing of one tenant is visible to another, over every endpoint, with a real
program's artifact and a real worker. Keys (401s, the admin endpoint, hashed storage) run on the
in-process stack (tests/unit/test_tenants.py)."""

from __future__ import annotations

import pytest

from tests.conftest import Stack, run_code

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
