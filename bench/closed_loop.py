"""What an agent sees: warm runs in a closed loop (each client sends its next request as soon as the
previous one answers; nobody lets the engine settle), with 1 and 8 clients, against the native
floor, in one run. A benchmark: it prints figures and asserts nothing.

Per series and workload: p50/p95/p99 as the client measures it, the fraction of runs that found
the pool empty and started cold, the fraction that ran in a preloaded interpreter (python), and
where the time went, from each run's own record (median of queue wait, sandbox start or take, run,
collect, and the rest: storing and answering). Host processes (the bench's own Redis, API and
workers, like bench/compare.py) always; the compose stack too with --stack (after `make up`).

Also one client that pauses --think seconds between calls, as an agent reading each answer does.

Usage: python bench/closed_loop.py [--runs 60] [--clients 1 8] [--think 1] [--workers 2] [--pool 2] [--stack]
       [--preload-off]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import IMAGE, WORKLOADS, Engine, Service, redis_server, run_all, summary

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("queue_wait_ms", "sandbox_start_ms", "run_ms", "collect_ms")


def native_in_image(code: str, runs: int) -> list[float]:
    """`python3 -c CODE` inside one sandbox container of the image: the interpreter's own floor."""
    probe = (
        "import subprocess, sys, time\n"
        "out = []\n"
        f"for _ in range({runs}):\n"
        "    t = time.perf_counter()\n"
        "    subprocess.run([sys.executable, '-c', sys.argv[1]], check=True, capture_output=True)\n"
        "    out.append((time.perf_counter() - t) * 1000)\n"
        "print(' '.join(f'{v:.3f}' for v in out))\n"
    )
    argv = ["docker", "run", "--rm", "--network", "none", "--user", "65534:65534", "-e", "MPLBACKEND=Agg",
            "-e", "PATH=/opt/python/bin:/usr/bin:/bin", IMAGE, "python3", "-c", probe, code]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return [float(v) for v in done.stdout.split()]


def closed_loop(post: Callable[[httpx.Client, str], dict[str, Any]], make: Callable[[], httpx.Client], code: str,
                expected: str, clients: int, runs: int, think_s: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """`clients` threads, each sending `runs` requests back to back (or `think_s` apart)."""
    rows: list[tuple[float, dict[str, Any]]] = []
    errors = 0
    lock = threading.Lock()

    def client_loop() -> None:
        nonlocal errors
        with make() as client:
            for _ in range(runs):
                start = time.perf_counter()
                body = post(client, code)
                elapsed = (time.perf_counter() - start) * 1000
                with lock:
                    if body.get("status") == "succeeded" and body.get("stdout") == expected:
                        rows.append((elapsed, body))
                    else:
                        errors += 1
                time.sleep(think_s)

    wall = run_all([threading.Thread(target=client_loop) for _ in range(clients)])
    timings = [body["timing"] for _, body in rows]
    phases = {p: statistics.median(t.get(p) or 0.0 for t in timings) for p in PHASES} if timings else {}
    if timings:
        phases["store_and_answer_ms"] = statistics.median(ms - (b["timing"].get("total_ms") or 0) for ms, b in rows)
    return {
        "latency": summary([ms for ms, _ in rows]),
        "cold_fraction": sum(not t.get("warm_start") for t in timings) / max(1, len(timings)),
        "per_s": len(rows) / wall,
        "errors": errors,
        "phases": phases,
    }


def show(name: str, row: dict[str, Any]) -> None:
    lat = row["latency"]
    phases = " ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in row["phases"].items())
    print(f"  {name:28} p50 {lat['p50_ms']:7.1f}  p95 {lat['p95_ms']:7.1f}  p99 {lat['p99_ms']:7.1f} ms  "
          f"p95/p50 {lat['p95_ms'] / lat['p50_ms']:4.2f}  cold {row['cold_fraction']:5.1%}  "
          f"{row['per_s']:5.1f}/s  errors {row['errors']}  | median ms: {phases}", flush=True)  # fmt: skip


def series(label: str, url: str, headers: dict[str, str], args: argparse.Namespace, out: dict[str, Any]) -> None:
    def make() -> httpx.Client:
        return httpx.Client(base_url=url, timeout=120, headers=headers)

    def post(client: httpx.Client, code: str) -> dict[str, Any]:
        answer: dict[str, Any] = client.post("/v1/executions?wait=60", json={"language": "python", "code": code}).json()
        return answer

    for workload, (code, expected) in WORKLOADS.items():
        with make() as client:
            for _ in range(3):
                post(client, code)  # warm-up: connections, page cache
        for clients in args.clients:
            row = closed_loop(post, make, code, expected, clients, args.runs)
            out.setdefault(workload, {})[f"{label}, {clients} client(s)"] = row
            show(f"{workload}: {label}, {clients} cl.", row)
        if args.think:  # an agent that reads each answer before its next call
            row = closed_loop(post, make, code, expected, 1, max(10, args.runs // 2), args.think)
            out[workload][f"{label}, 1 client, {args.think:g} s apart"] = row
            show(f"{workload}: {label}, {args.think:g} s apart", row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="requests per client and series")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=2, help="warm python containers per worker")
    parser.add_argument("--think", type=float, default=1.0, help="also 1 client with this pause (0: not)")
    parser.add_argument("--stack", action="store_true", help="also through the compose stack on :8000")
    parser.add_argument("--preload-off", action="store_true", help="also host processes without preloading")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for workload, (code, _) in WORKLOADS.items():
        floor = summary(native_in_image(code, args.runs))
        out.setdefault(workload, {})["native (python3 -c, in the image)"] = floor
        print(f"  {workload}: native python3 -c in the image: p50 {floor['p50_ms']:.1f}  p95 {floor['p95_ms']:.1f} ms")
    variants = {"": {}, ", no preload": {"EXECBOX_POOL__PRELOAD": "false"}} if args.preload_off else {"": {}}
    with tempfile.TemporaryDirectory(prefix="execbox-loop-") as tmp, redis_server(Path(tmp)) as redis_url:
        for suffix, extra in variants.items():
            service = Service(args.workers, args.pool, Path(tmp), redis_url, extra)
            try:
                engine = Engine()
                engine.settle(service)
                time.sleep(5)  # a preloading container finishes its imports (no signal reaches the host)
                idle = engine.pool_container_mib(service.prefix)
                print(f"  idle warm container{suffix or ', preloaded'}: {idle or float('nan'):.1f} MiB")
                out[f"idle warm container MiB{suffix}"] = idle
                series(f"host processes, pool {args.pool}/worker{suffix}", service.url, {}, args, out)
            finally:
                service.stop()
    if args.stack:
        key = (ROOT / ".run" / "api-key").read_text().strip()
        series("compose stack", "http://127.0.0.1:8000", {"Authorization": f"Bearer {key}"}, args, out)
    print("\nratios (same run):")
    for workload in WORKLOADS:
        rows = out[workload]
        floor = rows["native (python3 -c, in the image)"]["p50_ms"]
        for name, row in rows.items():
            if "latency" in row:
                lat = row["latency"]
                print(f"  {workload}: {name}: p50 / native p50 {lat['p50_ms'] / floor:5.2f}, "
                      f"p95 / own p50 {lat['p95_ms'] / lat['p50_ms']:4.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
