"""runc against gVisor (runsc), in one run: cold-start latency and throughput of `print(1)` through
execbox for each OCI runtime. A benchmark: it prints figures and asserts nothing.

Both series run cold (gVisor runs never come from the warm pool, so runc is measured cold too);
latency is --runs back-to-back calls from one client, throughput --seconds with --clients
clients. Prints p50/p95 per runtime and the ratios runsc/runc. Starts its own Redis, API and
workers like bench/compare.py; needs `make engine` (which registers runsc) and the images.

Usage: python bench/runtimes.py [--runs 40] [--seconds 20] [--clients 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, summary, throughput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    body = {"language": "python", "code": "print(1)"}
    rows = {}
    with tempfile.TemporaryDirectory(prefix="execbox-runtimes-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 0, Path(tmp), redis_url)
        try:
            for runtime in ("runc", "runsc"):
                request: dict[str, object] = {**body, "policy": {"runtime": runtime}}
                with httpx.Client(base_url=service.url, timeout=120) as client:

                    def one(client: httpx.Client = client, request: dict[str, object] = request) -> bool:
                        answer = client.post("/v1/executions?wait=60", json=request).json()
                        return bool(answer.get("stdout") == "1\n")

                    latencies = []
                    for _ in range(args.runs):
                        start = time.perf_counter()
                        assert one(), f"{runtime}: a run failed"
                        latencies.append((time.perf_counter() - start) * 1000)
                    rate = throughput(one, args.clients, args.seconds, None)
                rows[runtime] = {"latency": summary(latencies), "per_s": rate["per_s"], "errors": rate["errors"]}
                lat = rows[runtime]["latency"]
                print(f"{runtime}: cold p50 {lat['p50_ms']:.0f} ms p95 {lat['p95_ms']:.0f} ms; "
                      f"{rate['per_s']:.1f} executions/s at {args.clients} clients, {rate['errors']} errors",
                      flush=True)  # fmt: skip
        finally:
            service.stop()
    ratio_p50 = rows["runsc"]["latency"]["p50_ms"] / rows["runc"]["latency"]["p50_ms"]
    ratio_rate = rows["runsc"]["per_s"] / rows["runc"]["per_s"]
    print(f"runsc/runc: cold p50 {ratio_p50:.2f}, throughput {ratio_rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
