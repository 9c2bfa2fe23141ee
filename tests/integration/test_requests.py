"""Bad input gets a problem+json 4xx, and none of it reaches a worker: end to end, a truncated body
through the real API process. The rest of the request checks run on the in-process stack
(tests/unit/test_api_requests.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from tests.conftest import Side, problem

pytestmark = [pytest.mark.redis]


@pytest.fixture
def idle(side_stack: Callable[..., Side]) -> Iterator[tuple[httpx.Client, Side]]:
    side = side_stack()
    with side.client() as client:
        yield client, side


def queued_jobs(side: Side) -> int:
    client = redis.Redis.from_url(side.env["EXECBOX_REDIS__URL"])
    return int(client.llen(f"rq:queue:{side.env['EXECBOX_QUEUE__NAME']}"))


def test_malformed_json_is_400(idle: tuple[httpx.Client, Side]) -> None:
    client, side = idle
    response = client.post(
        "/v1/executions", content=b'{"language": "python", "code": ', headers={"content-type": "application/json"}
    )
    problem(response, 400, "request.malformed_json")
    assert queued_jobs(side) == 0
