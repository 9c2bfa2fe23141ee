"""Bad input gets a problem+json 4xx naming the field, and none of it reaches a worker: the API of
the in-process stack (tests/unit/stack.py), no worker stepped, so the queue's tickets count what
was accepted. Moved from tests/integration/test_requests.py (issue 45); the body bound and the
problem shapes are the app's own (api/limits.py's middleware, api/problems.py), not the server's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Redis, problem
from tests.unit.stack import InStack, in_stack

pytestmark = pytest.mark.redis


def fields(body: dict[str, Any]) -> set[str]:
    return {e["field"] for e in body["errors"]}


def queued_jobs(inproc: InStack) -> int:
    """Dispatch tickets in the stack's RQ list: one per accepted execution (no worker takes them)."""
    return int(inproc.redis.llen(f"rq:queue:{inproc.settings.queue.name}"))


CASES = [
    ({"language": "cobol", "code": "x"}, 422, "request.unknown_language", "language"),
    ({"language": "python", "code": ""}, 422, "request.invalid", "code"),
    ({"language": "python", "code": "   \n"}, 422, "request.invalid", "code"),
    ({"language": "python"}, 422, "request.invalid", "code"),
    ({"language": "python", "code": "x", "policy": {"timeout_s": -1}}, 422, "request.invalid", "policy.timeout_s"),
    ({"language": "python", "code": "x", "policy": {"memory_mb": 10**12}}, 422, "request.invalid", "policy.memory_mb"),
    ({"language": "python", "code": "x", "policy": {"pids": "many"}}, 422, "request.invalid", "policy.pids"),
    (
        {"language": "python", "code": "x", "policy": {"timeout_s": 121}},
        422,
        "request.policy_exceeded",
        "policy.timeout_s",
    ),
    ({"language": "python", "code": "x", "policy": {"name": "huge"}}, 422, "request.unknown_policy", "policy.name"),
    ({"language": "python", "code": "x", "policy": {"network": "host"}}, 422, "request.invalid", "policy.network"),
    ({"language": "python", "code": "x", "surprise": 1}, 422, "request.invalid", "surprise"),
    ({"language": "python", "code": "x", "env": {"1BAD": "v"}}, 422, "request.invalid", "env"),
    ({"language": "python", "code": "x" * 1_100_000}, 422, "request.policy_exceeded", "code"),
]


@pytest.fixture(scope="class")
def idle(redis_server: Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InStack]:
    """One stack for the class's tests: each is refused or only reads, so nothing they send may queue
    (each checks the queue is still empty)."""
    with in_stack(redis_server, tmp_path_factory.mktemp("idle")) as inproc:
        yield inproc


class TestRefusedOrRead:
    """Requests a stack answers without queueing anything, on one stack (a stack each costs more
    than these requests)."""

    @pytest.mark.parametrize(("body", "status", "code", "field"), CASES)
    def test_bad_execution_request_is_refused(
        self, idle: InStack, body: dict[str, Any], status: int, code: str, field: str
    ) -> None:
        with idle.client() as client:
            refused = problem(client.post("/v1/executions", json=body), status, code)
        assert field in fields(refused), refused
        assert queued_jobs(idle) == 0

    def test_ceiling_message_names_the_ceiling(self, idle: InStack) -> None:
        with idle.client() as client:
            body = problem(
                client.post("/v1/executions", json={"language": "python", "code": "x", "policy": {"memory_mb": 4096}}),
                422,
                "request.policy_exceeded",
            )
        assert "2048" in body["errors"][0]["message"] and "default" in body["errors"][0]["message"]

    def test_invalid_and_unknown_ids(self, idle: InStack) -> None:
        with idle.client() as client:
            assert "path.execution_id" in fields(
                problem(client.get("/v1/executions/not-an-id"), 422, "request.invalid")
            )
            problem(client.get("/v1/executions/exe_" + "a" * 26), 404, "execution.not_found")
            problem(client.post("/v1/executions/exe_" + "a" * 26 + "/cancel"), 404, "execution.not_found")

    def test_wait_above_server_limit_is_refused(self, idle: InStack) -> None:
        body = {"language": "python", "code": "print(1)"}
        with idle.client() as client:
            waited = client.post("/v1/executions?wait=1000", json=body)
            preferred = client.post("/v1/executions", json=body, headers={"Prefer": "wait=1000"})
        assert "query.wait" in fields(problem(waited, 422, "request.invalid"))
        assert "header.Prefer" in fields(problem(preferred, 422, "request.invalid"))
        assert queued_jobs(idle) == 0

    def test_languages_lists_every_sandbox_images_folder(self, idle: InStack) -> None:
        with idle.client() as client:
            names = {lang["name"] for lang in client.get("/v1/languages").json()["languages"]}
        folders = {p.parent.name for p in (ROOT / "sandbox-images").glob("*/metadata.yaml")}
        assert (
            len(names) == len(folders) and {"python", "python@slim", "javascript", "typescript", "bash", "r"} <= names
        )

    def test_openapi_describes_every_request_field(self, idle: InStack) -> None:
        with idle.client() as client:
            schemas = client.get("/openapi.json").json()["components"]["schemas"]
        assert "HTTPValidationError" not in schemas  # our 422s are problem+json, and documented so
        for name in (
            "ExecutionCreate",
            "PolicyRequest",
            "ExecutionPublic",
            "ExecutionError",
            "Timing",
            "Resources",
            "AppliedPolicy",
            "LanguagePublic",
            "Problem",
            "ProblemField",
        ):
            for field, spec in schemas[name]["properties"].items():
                assert spec.get("description"), f"{name}.{field} has no description"

    def test_unknown_paths_and_methods_are_problems_too(self, idle: InStack) -> None:
        with idle.client() as client:
            problem(client.get("/v2/nothing"), 404, "not_found")
            problem(client.delete("/v1/languages"), 405, "method_not_allowed")
            problem(
                client.post("/v1/files", content=b"x", headers={"content-type": "multipart/form-data"}),
                400,
                "request.malformed",
            )
            metrics = client.get("/metrics").text
        assert 'execbox_api_requests_total{code="404",method="GET",route="unmatched"}' in metrics
        # matched routes carry their template, never the raw path (the DELETE: the class's other tests GET it)
        assert 'execbox_api_requests_total{code="405",method="DELETE",route="/v1/languages"}' in metrics


def test_named_policy_raises_the_ceiling(inproc: InStack) -> None:
    with inproc.client() as client:
        response = client.post(
            "/v1/executions", json={"language": "python", "code": "x", "policy": {"name": "large", "memory_mb": 4096}}
        )
    assert response.status_code == 202, response.text
    assert response.json()["policy"]["memory_mb"] == 4096 and response.json()["policy"]["timeout_s"] == 60
    assert queued_jobs(inproc) == 1


def test_prefer_wait_returns_202_while_queued(inproc: InStack) -> None:
    with inproc.client() as client:  # no worker stepped: the execution is still queued when the wait ends
        response = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Prefer": "wait=0.5"}
        )
    assert response.status_code == 202 and response.json()["status"] == "queued", response.text
    assert response.headers["location"] == f"/v1/executions/{response.json()['id']}"


def test_oversized_body_is_413(redis_server: Redis, tmp_path: Path) -> None:
    with in_stack(redis_server, tmp_path, api={"max_body_bytes": 1 << 20}) as inproc, inproc.client() as client:
        body = {"language": "python", "code": "x" * (2 << 20)}
        problem(client.post("/v1/executions", json=body), 413, "request.too_large")
        upload = client.post("/v1/files", files={"file": ("big.bin", b"x" * (2 << 20))})
        problem(upload, 413, "request.too_large")
        assert queued_jobs(inproc) == 0
