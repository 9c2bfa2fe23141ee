"""Bad input gets a problem+json 4xx naming the field, and none of it reaches a worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import ROOT, Side

pytestmark = [pytest.mark.redis]


@pytest.fixture
def idle(side_stack: Callable[..., Side]) -> Iterator[tuple[httpx.Client, Side]]:
    side = side_stack()
    with side.client() as client:
        yield client, side


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


def fields(body: dict[str, Any]) -> set[str]:
    return {e["field"] for e in body["errors"]}


def queued_jobs(side: Side) -> int:
    client = redis.Redis.from_url(side.env["EXECBOX_REDIS__URL"])
    return int(client.llen(f"rq:queue:{side.env['EXECBOX_QUEUE__NAME']}"))


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


@pytest.mark.parametrize(("body", "status", "code", "field"), CASES)
def test_bad_execution_request_is_refused(
    idle: tuple[httpx.Client, Side], body: dict[str, Any], status: int, code: str, field: str
) -> None:
    client, side = idle
    refused = problem(client.post("/v1/executions", json=body), status, code)
    assert field in fields(refused), refused
    assert queued_jobs(side) == 0


def test_ceiling_message_names_the_ceiling(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
    body = problem(
        client.post("/v1/executions", json={"language": "python", "code": "x", "policy": {"memory_mb": 4096}}),
        422,
        "request.policy_exceeded",
    )
    assert "2048" in body["errors"][0]["message"] and "default" in body["errors"][0]["message"]


def test_named_policy_raises_the_ceiling(idle: tuple[httpx.Client, Side]) -> None:
    client, side = idle
    response = client.post(
        "/v1/executions", json={"language": "python", "code": "x", "policy": {"name": "large", "memory_mb": 4096}}
    )
    assert response.status_code == 202, response.text
    assert response.json()["policy"]["memory_mb"] == 4096 and response.json()["policy"]["timeout_s"] == 60
    assert queued_jobs(side) == 1


def test_malformed_json_is_400(idle: tuple[httpx.Client, Side]) -> None:
    client, side = idle
    response = client.post(
        "/v1/executions", content=b'{"language": "python", "code": ', headers={"content-type": "application/json"}
    )
    problem(response, 400, "request.malformed_json")
    assert queued_jobs(side) == 0


def test_oversized_body_is_413(side_stack: Callable[..., Side]) -> None:
    side = side_stack(EXECBOX_API__MAX_BODY_BYTES=str(1 << 20))
    with side.client() as client:
        body = {"language": "python", "code": "x" * (2 << 20)}
        problem(client.post("/v1/executions", json=body), 413, "request.too_large")
        upload = client.post("/v1/files", files={"file": ("big.bin", b"x" * (2 << 20))})
        problem(upload, 413, "request.too_large")


def test_invalid_and_unknown_ids(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
    assert "path.execution_id" in fields(problem(client.get("/v1/executions/not-an-id"), 422, "request.invalid"))
    problem(client.get("/v1/executions/exe_" + "a" * 26), 404, "execution.not_found")
    problem(client.post("/v1/executions/exe_" + "a" * 26 + "/cancel"), 404, "execution.not_found")


def test_wait_above_server_limit_is_refused(idle: tuple[httpx.Client, Side]) -> None:
    client, side = idle
    body = {"language": "python", "code": "print(1)"}
    assert "query.wait" in fields(problem(client.post("/v1/executions?wait=1000", json=body), 422, "request.invalid"))
    refused = problem(client.post("/v1/executions", json=body, headers={"Prefer": "wait=1000"}), 422, "request.invalid")
    assert "header.Prefer" in fields(refused)
    assert queued_jobs(side) == 0


def test_prefer_wait_returns_202_while_queued(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
    response = client.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Prefer": "wait=0.5"}
    )
    assert response.status_code == 202 and response.json()["status"] == "queued"
    assert response.headers["location"] == f"/v1/executions/{response.json()['id']}"


def test_languages_lists_every_sandbox_images_folder(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
    names = {lang["name"] for lang in client.get("/v1/languages").json()["languages"]}
    folders = {p.parent.name for p in (ROOT / "sandbox-images").glob("*/metadata.yaml")}
    assert len(names) == len(folders) and {"python", "python@slim", "javascript", "typescript", "bash", "r"} <= names


def test_openapi_describes_every_request_field(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
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


def test_unknown_paths_and_methods_are_problems_too(idle: tuple[httpx.Client, Side]) -> None:
    client, _ = idle
    problem(client.get("/v2/nothing"), 404, "not_found")
    problem(client.delete("/v1/languages"), 405, "method_not_allowed")
    problem(
        client.post("/v1/files", content=b"x", headers={"content-type": "multipart/form-data"}),
        400,
        "request.malformed",
    )
    metrics = client.get("/metrics").text
    assert 'execbox_api_requests_total{code="404",method="GET",route="unmatched"}' in metrics
    assert 'route="/v1/languages"' in metrics  # matched routes carry their template, never the raw path
