"""A chain of steps run as a plan against the same chain driven by the client, in one run. A
benchmark: it prints figures and asserts nothing.

The client-driven chain is what an agent without plans does: POST each step with ?wait=, read
its outputs, put them into the next request. The plan posts once and waits for the run. Both pass
a small JSON value from each step to the next; both use warm sandboxes (pool 1 per worker).
Prints p50/p95 of the whole chain for each and the ratio plan/client (the executor's overhead,
or its saving of client round trips). Starts its own Redis, API and workers like bench/compare.py.

Usage: python bench/plans.py [--steps 5] [--rounds 15] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, summary

CELL = "import execbox\nexecbox.emit('n', (execbox.inputs or {}).get('n', 0) + 1)\n"


def client_chain(service: Service, steps: int) -> float:
    start = time.perf_counter()
    n: Any = None
    for _ in range(steps):
        body = {"language": "python", "code": CELL, "inputs": {"n": n} if n is not None else None}
        answer = service.client.post("/v1/executions?wait=60", json=body).json()
        assert answer["status"] == "succeeded", answer
        n = answer["outputs"]["n"]
    assert n == steps
    return (time.perf_counter() - start) * 1000


def plan_chain(service: Service, steps: int) -> float:
    chain: list[dict[str, Any]] = [{"id": "s0", "run": {"code": CELL}}]
    chain += [{"id": f"s{i}", "run": {"code": CELL}, "args": {"n": {"$ref": f"/steps/s{i - 1}/outputs/n"}}}
              for i in range(1, steps)]  # fmt: skip
    start = time.perf_counter()
    run = service.client.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": chain}}).json()
    run = service.client.get(f"/v1/runs/{run['id']}?wait=60").json()
    assert run["status"] == "succeeded" and run["steps"][f"s{steps - 1}"]["outputs"] == {"n": steps}, run
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execbox-plans-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url)
        try:
            client_chain(service, args.steps)  # warm both paths once
            plan_chain(service, args.steps)
            timings: dict[str, list[float]] = {"client": [], "plan": []}
            for _ in range(args.rounds):  # interleaved, so that drift hits both alike
                timings["client"].append(client_chain(service, args.steps))
                timings["plan"].append(plan_chain(service, args.steps))
        finally:
            service.stop()
    rows = {name: summary(values) for name, values in timings.items()}
    for name, row in rows.items():
        print(f"{name}-driven chain of {args.steps}: p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms")
    ratio = rows["plan"]["p50_ms"] / rows["client"]["p50_ms"]
    print(f"plan / client p50: {ratio:.2f} ({args.rounds} rounds, {args.workers} workers, warm pool 1 each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
