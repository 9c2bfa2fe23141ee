"""Fair scheduling: a tenant that floods the queue does not starve another (real Redis, real worker)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import redis

from tests.conftest import Side, Stack, auth, wait_until


def test_round_robin_across_tenants_skips_cancelled(side_stack: Callable[..., Side], stack: Stack) -> None:
    side = side_stack()  # no worker yet: everything below waits in the queue
    body = {"language": "python", "code": "print(1)"}

    def submit(client: httpx.Client) -> str:
        response = client.post("/v1/executions", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    with side.client() as alpha, httpx.Client(base_url=side.base_url, headers=auth(stack.keys["beta"])) as beta:
        flood = [submit(alpha) for _ in range(6)]
        other = [submit(beta) for _ in range(3)]
        assert alpha.post(f"/v1/executions/{flood[1]}/cancel").json()["status"] == "cancelled"
        tickets = redis.Redis.from_url(side.env["EXECBOX_REDIS__URL"])
        queue_key = f"rq:queue:{side.env['EXECBOX_QUEUE__NAME']}"
        assert tickets.llen(queue_key) == 9  # one per accepted execution; the cancelled one's is skipped later

        side.worker("w1")  # one worker, so start order is the dispatch order
        records = {}
        for execution_id in flood + other:
            client = beta if execution_id in other else alpha
            records[execution_id] = client.get(f"/v1/executions/{execution_id}?wait=60").json()
        wait_until(lambda: tickets.llen(queue_key) == 0, 20, "every ticket to be taken")

    assert {records[i]["status"] for i in flood[:1] + flood[2:] + other} == {"succeeded"}
    assert records[flood[1]]["status"] == "cancelled" and records[flood[1]]["started_at"] is None
    started = sorted((r["started_at"], i) for i, r in records.items() if r["started_at"] is not None)
    order = [i for _, i in started]
    # Round-robin over tenants with work waiting, FIFO within a tenant; the cancelled entry used up
    # alpha's second turn. First-come order would have run all of alpha's five before any of beta's.
    assert order == [flood[0], other[0], other[1], flood[2], other[2], flood[3], flood[4], flood[5]]
