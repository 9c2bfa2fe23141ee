"""What declaring side effects costs the fused path, in one run: back-to-back executions that wait
for their result, undeclared against `effect: read` and against a keyed write; an approval-gated
execution from submit to result with its decision made at once (the gate's own overhead); and a
`status_read` write whose code says its outcome is unknown (one code run plus its status check)
against the plain cell. A benchmark: it prints figures and asserts nothing.

The kinds interleave round by round so that drift hits them alike. Starts its own Redis, API and
workers like bench/compare.py.

Usage: python bench/effects.py [--rounds 30] [--workers 2]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, summary

UNSURE = "import execbox\nexecbox.outcome_unknown('the provider timed out')"
APPLIED = {"name": "status", "code": "import execbox\nexecbox.emit('applied', True)",
           "expect": {"properties": {"applied": {"const": True}}}}  # fmt: skip


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def run(service: Service, **fields: Any) -> dict[str, Any]:
    body = {"language": "python", "code": "1", **fields}
    answer: dict[str, Any] = service.client.post("/v1/executions?wait=60", json=body).json()
    while answer["status"] in ("queued", "running"):
        answer = service.client.get(f"/v1/executions/{answer['id']}?wait=60").json()
    return answer


def gated(service: Service) -> dict[str, Any]:
    body = {"language": "python", "code": "1", "approval": {"summary": "bench"}}
    waiting = service.client.post("/v1/executions", json=body).json()
    service.client.post(f"/v1/approvals/{waiting['approval_id']}/decision", json={"decision": "approve"})
    answer: dict[str, Any] = service.client.get(f"/v1/executions/{waiting['id']}?wait=60").json()
    return answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    kinds: dict[str, Callable[[Service], dict[str, Any]]] = {
        "undeclared": lambda s: run(s),
        "effect: read": lambda s: run(s, effect="read"),
        "keyed write": lambda s: run(s, effect="write",
                                     idempotency={"strategy": "key", "key": f"k-{secrets.token_hex(6)}"}),
        "approved at once": gated,
        "status_read after outcome_unknown": lambda s: run(s, code=UNSURE, effect="write", idempotency={
            "strategy": "status_read", "key": f"k-{secrets.token_hex(6)}", "status_check": APPLIED}),
    }  # fmt: skip
    series: dict[str, list[float]] = {name: [] for name in kinds}
    with tempfile.TemporaryDirectory(prefix="execbox-effects-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url)
        try:
            for kind in kinds.values():  # warm each path once
                kind(service)
            for _ in range(args.rounds):
                for name, kind in kinds.items():
                    start = time.perf_counter()
                    answer = kind(service)
                    series[name].append(ms(start))
                    assert answer["status"] == "succeeded", answer
        finally:
            service.stop()
    rows = {name: summary(values) for name, values in series.items()}
    base = rows["undeclared"]["p50_ms"]
    for name, row in rows.items():
        print(f"{name}: p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms, "
              f"p50 / undeclared {row['p50_ms'] / base:.2f} ({len(series[name])} samples)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
