"""Idempotency keys: retries of a create return what the first attempt created, exactly once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from tests.conftest import Side

pytestmark = [pytest.mark.redis]


def test_fifty_concurrent_retries_create_one_execution(side_stack: Callable[..., Side]) -> None:
    side = side_stack()  # no worker: the one execution stays queued, so the queue length counts creations
    body = {"language": "python", "code": "print('once')"}

    def post(_: int) -> httpx.Response:
        with side.client() as client:
            return client.post("/v1/executions", json=body, headers={"Idempotency-Key": "order-17"})

    with ThreadPoolExecutor(max_workers=50) as pool:
        responses = list(pool.map(post, range(50)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 49
    queue = redis.Redis.from_url(side.env["EXECBOX_REDIS__URL"])
    assert queue.llen(f"rq:queue:{side.env['EXECBOX_QUEUE__NAME']}") == 1


def test_same_key_different_body_is_refused(side_stack: Callable[..., Side]) -> None:
    with side_stack().client() as client:
        first = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "k1"}
        )
        assert first.status_code == 202 and "idempotent-replayed" not in first.headers
        again = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "k1"}
        )
        assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
        other = client.post(
            "/v1/executions", json={"language": "python", "code": "print(2)"}, headers={"Idempotency-Key": "k1"}
        )
        assert other.status_code == 422 and other.json()["code"] == "idempotency.mismatch"
        bad = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "has space"}
        )
        assert bad.status_code == 422 and "header.Idempotency-Key" in {e["field"] for e in bad.json()["errors"]}


def test_refused_request_does_not_burn_the_key(side_stack: Callable[..., Side]) -> None:
    with side_stack().client() as client:
        refused = client.post(
            "/v1/executions",
            json={"language": "python", "code": "x", "policy": {"pids": 9999}},
            headers={"Idempotency-Key": "k2"},
        )
        assert refused.status_code == 422
        fixed = client.post(
            "/v1/executions", json={"language": "python", "code": "x"}, headers={"Idempotency-Key": "k2"}
        )
        assert fixed.status_code == 202 and "idempotent-replayed" not in fixed.headers


def test_file_upload_retries_return_the_first_file(side_stack: Callable[..., Side]) -> None:
    with side_stack().client() as client:
        ids = {
            client.post("/v1/files", files={"file": ("a.csv", b"x,y\n")}, headers={"Idempotency-Key": "up-1"}).json()[
                "id"
            ]
            for _ in range(3)
        }
        assert len(ids) == 1
        other = client.post("/v1/files", files={"file": ("a.csv", b"changed")}, headers={"Idempotency-Key": "up-1"})
        assert other.status_code == 422 and other.json()["code"] == "idempotency.mismatch"
