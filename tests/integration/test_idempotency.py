"""Idempotency keys end to end: fifty concurrent retries over real connections to the real API create
one execution. Replays, mismatches, refused requests and uploads run on the in-process stack
(tests/unit/test_idempotency.py)."""

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
