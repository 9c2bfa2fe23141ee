"""Against the compose stack (`make stack-test` starts it with three workers and stops it after).

A smoke test of a few outcome categories, load spread over workers while one of them stops, and
the run records that say who ran what.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.stack]
URL = os.environ.get("EXECBOX_STACK_URL", "http://127.0.0.1:8000")
PROJECT = "execbox"
KEY_FILE = Path(__file__).resolve().parents[2] / ".run" / "api-key"  # written by `make up`


def compose_containers(service: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
         "--filter", f"label=com.docker.compose.service={service}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.split()


@pytest.fixture
def api() -> Any:
    key = os.environ.get("EXECBOX_API_KEY") or KEY_FILE.read_text().strip()
    with httpx.Client(base_url=URL, timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:
        if client.get("/readyz").status_code != 200:
            pytest.fail(f"the compose stack is not ready at {URL}: run `make stack-test` (or `make up`)")
        yield client


def run(api: httpx.Client, code: str, language: str = "python", **policy: Any) -> dict[str, Any]:
    response = api.post("/v1/executions?wait=60", json={"language": language, "code": code, "policy": policy})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_outcomes_through_the_stack(api: httpx.Client) -> None:
    ok = run(api, "import execbox\nopen(execbox.output_dir + '/r.txt', 'w').write('done')\nprint(1)")
    assert ok["status"] == "succeeded" and ok["stdout"] == "1\n"
    assert api.get(ok["artifacts"][0]["url"]).content == b"done"  # worker wrote it, the API serves it
    assert run(api, "raise ValueError('x')")["error"]["category"] == "code.exception"
    assert run(api, "import time\ntime.sleep(30)", timeout_s=1)["error"]["category"] == "limit.timeout"
    assert run(api, "b = b'x' * (200 << 20)", memory_mb=64)["error"]["category"] == "limit.memory"
    assert run(api, "echo hi >&2; exit 3", language="bash")["error"]["category"] == "code.exit_nonzero"


def test_warm_pool_and_egress_proxy_are_up(api: httpx.Client) -> None:
    assert compose_containers("egress"), "the egress service is not running"
    health = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", "execbox-egress"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert health == "healthy"
    # Warm containers wait (one per worker): a default run takes one.
    wait_until(lambda: run(api, "print(1)")["timing"]["warm_start"], 30, "a run to start warm")
    # The default policy allows no host, so an allowlist is refused before anything runs.
    refused = api.post("/v1/executions", json={"language": "python", "code": "print(1)",
                       "policy": {"network": {"mode": "allowlist", "allow": ["pypi.org"]}}})  # fmt: skip
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "policy.network.allow.0"


def test_load_spreads_over_workers_and_a_stopped_worker_loses_nothing(api: httpx.Client) -> None:
    workers = compose_containers("worker")
    assert len(workers) == 3, "make stack-test starts three workers"
    code = "import time\ntime.sleep(0.5)\nprint('ok')"

    def submit(_: int) -> str:
        response = api.post("/v1/executions", json={"language": "python", "code": code})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        ids = list(pool.map(submit, range(60)))

    def busy_workers() -> set[str]:
        return {str(api.get(f"/v1/executions/{i}").json()["worker"]) for i in ids[:30]} - {"None"}

    # Every worker takes part of the load before one of them goes away.
    wait_until(lambda: len(busy_workers()) == 3, 60, "all three workers to take executions")
    subprocess.run(["docker", "stop", "-t", "60", workers[0]], check=True, capture_output=True)
    finals = [api.get(f"/v1/executions/{i}?wait=60").json() for i in ids]
    statuses = {f["status"] for f in finals}
    assert statuses <= {"succeeded", "failed"}, statuses
    lost = [f for f in finals if f["status"] == "failed"]
    assert all(f["error"]["category"] == "sandbox.error" and f["error"]["retryable"] for f in lost), lost
    ran_on = {api.get(f"/v1/executions/{i}/record").json()["worker"] for i in ids}
    assert len(ran_on) == 3, ran_on
    subprocess.run(["docker", "start", workers[0]], check=True, capture_output=True)
    wait_until(lambda: api.get("/readyz").json()["checks"]["workers"]["alive"] >= 3, 60, "the worker to return")
