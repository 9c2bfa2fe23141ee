"""Throughput of print(1) through a running execbox (`make up`): N clients for T seconds each.

Prints executions/s, error counts and latency percentiles per concurrency level, and the machine's
core count, for the sizing guide in deploy/README.md. Not a test: it asserts nothing.
Usage: python bench/throughput.py [--url URL] [--seconds 20] [--concurrency 1 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import httpx

from latency import auth_header


def level(url: str, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        nonlocal errors
        with httpx.Client(base_url=url, timeout=60, headers=auth_header()) as http:
            while time.monotonic() < stop:
                start = time.perf_counter()
                body = http.post("/v1/executions?wait=30", json={"language": "python", "code": "print(1)"}).json()
                elapsed = (time.perf_counter() - start) * 1000
                with lock:
                    if body.get("status") == "succeeded":
                        latencies.append(elapsed)
                    else:
                        errors += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    return {
        "clients": clients,
        "executions_per_s": len(latencies) / wall,
        "errors": errors,
        "p50_ms": statistics.median(latencies) if latencies else 0.0,
        "p95_ms": statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--json", type=Path, default=Path("bench/results/throughput.json"))
    args = parser.parse_args()
    rows = [level(args.url, c, args.seconds) for c in args.concurrency]
    for row in rows:
        print(f"clients {row['clients']:3d}: {row['executions_per_s']:6.2f} exec/s  errors {row['errors']}  "
              f"p50 {row['p50_ms']:6.1f} ms  p95 {row['p95_ms']:6.1f} ms")  # fmt: skip
    print(f"cores: {os.cpu_count()}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cores": os.cpu_count(), "levels": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
