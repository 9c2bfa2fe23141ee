"""Fair scheduling through the API and the worker's job function: a tenant that floods the queue
does not starve another, and a cancelled entry is skipped (in-process stack, real Redis; the worker
is stepped one dispatch ticket at a time, so the order it runs them in is the dispatch order)."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.stack import NOTHING, InStack

pytestmark = pytest.mark.redis


def test_round_robin_across_tenants_skips_cancelled(inproc: InStack) -> None:
    body = {"language": "python", "code": "print(1)"}

    def submit(client: httpx.Client) -> str:
        response = client.post("/v1/executions", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    with inproc.client("alpha") as alpha, inproc.client("beta") as beta:
        flood = [submit(alpha) for _ in range(6)]
        other = [submit(beta) for _ in range(3)]
        assert alpha.post(f"/v1/executions/{flood[1]}/cancel").json()["status"] == "cancelled"
        tickets = f"rq:queue:{inproc.settings.queue.name}"
        assert inproc.redis.llen(tickets) == 9  # one per accepted execution; the cancelled one's is skipped later

        ran = [inproc.run_one() for _ in range(9)]  # one call per ticket, as the worker makes them
        records = {i: (beta if i in other else alpha).get(f"/v1/executions/{i}").json() for i in flood + other}

    assert ran[-1] == NOTHING, "the cancelled entry's ticket finds nothing to run"
    assert {records[i]["status"] for i in flood[:1] + flood[2:] + other} == {"succeeded"}
    assert records[flood[1]]["status"] == "cancelled" and records[flood[1]]["started_at"] is None
    started = sorted((r["started_at"], i) for i, r in records.items() if r["started_at"] is not None)
    # Round-robin over tenants with work waiting, FIFO within a tenant; the cancelled entry used up
    # alpha's second turn. First-come order would have run all of alpha's five before any of beta's.
    order = [flood[0], other[0], other[1], flood[2], other[2], flood[3], flood[4], flood[5]]
    assert ran[:-1] == order and [i for _, i in started] == order
