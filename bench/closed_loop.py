"""What an agent sees: runs in a closed loop (each client sends its next request as soon as the
previous one answers; nobody lets the engine settle), with 1 and 8 clients, against the native
floor and `docker run`, in one run. A benchmark: it prints figures and asserts nothing.

Series: native `python3 -c` inside the image (the floor); `docker run --rm` of the image with the
sandbox's hardening, back to back; execbox with the pool the stack ships (python, 1 to 4 per
worker, sized by arrivals), and with no pool (every run cold); with --orderings also a pool that
refills during runs and a fixed pool of --pool; with --preload-off the shipped pool without
preloading; with --stack the compose stack on :8000 (after `make up`). Per series and workload:
p50/p95/p99 as the client measures it, the fraction of runs that found the pool empty and started
cold, runs/s, errors, and where the time went, from each run's own record (median of queue wait,
sandbox start or take, run, collect, and the rest: storing and answering). One client that pauses
--think seconds between calls, as an agent reading each answer does, for the shipped pool. With 8
clients each sends a quarter of --runs. Writes bench/results/closed_loop.json and .png.

Usage: python bench/closed_loop.py [--runs 60] [--clients 1 8] [--think 1] [--workers 2] [--pool 2]
       [--orderings] [--preload-off] [--stack]
"""

from __future__ import annotations

import argparse
import json
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
from compare import IMAGE, WORKLOADS, Engine, Service, docker_run, redis_server, run_all, summary, timed

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("queue_wait_ms", "sandbox_start_ms", "run_ms", "collect_ms")
SHIPPED = json.dumps([{"language": "python", "min": 1, "max": 4}])  # docker-compose.yml's


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


def per_client(runs: int, clients: int) -> int:
    return runs if clients == 1 else max(5, runs // 4)


def series(label: str, url: str, headers: dict[str, str], args: argparse.Namespace, out: dict[str, Any],
           think: bool = True) -> None:  # fmt: skip
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
            row = closed_loop(post, make, code, expected, clients, per_client(args.runs, clients))
            out.setdefault(workload, {})[f"{label}, {clients} client(s)"] = row
            show(f"{workload}: {label}, {clients} cl.", row)
        if think and args.think:  # an agent that reads each answer before its next call
            row = closed_loop(post, make, code, expected, 1, max(10, args.runs // 2), args.think)
            out[workload][f"{label}, 1 client, {args.think:g} s apart"] = row
            show(f"{workload}: {label}, {args.think:g} s apart", row)


def docker_series(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """`docker run --rm` back to back, one client: what a hand-rolled sandbox costs per call."""
    for workload, (code, expected) in WORKLOADS.items():
        action = docker_run(code, expected)
        samples = [timed(action) for _ in range(max(10, args.runs // 2))]
        lat, errors = summary([ms for ms, ok in samples if ok]), sum(not ok for _, ok in samples)
        out[workload]["docker run, 1 client"] = {"latency": lat, "errors": errors}
        print(f"  {workload}: docker run, 1 cl.: p50 {lat['p50_ms']:.1f}  p95 {lat['p95_ms']:.1f}  "
              f"p99 {lat['p99_ms']:.1f} ms  errors {errors}", flush=True)  # fmt: skip


def variants(args: argparse.Namespace) -> dict[str, tuple[int, dict[str, str], bool]]:
    """Label: (fixed pool size, worker env, with the think-time series)."""
    shipped = {"EXECBOX_POOL__CLASSES": SHIPPED}
    chosen = {"pool 1-4 (shipped)": (0, shipped, True), "no pool (cold)": (0, {}, False)}
    if args.orderings:
        chosen["pool 1-4, refill during runs"] = (0, {**shipped, "EXECBOX_POOL__REFILL_DURING_RUNS": "true"}, False)
        chosen[f"pool {args.pool} fixed"] = (args.pool, {}, False)
    if args.preload_off:
        chosen["pool 1-4, no preload"] = (0, {**shipped, "EXECBOX_POOL__PRELOAD": "false"}, False)
    return chosen


def chart(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(WORKLOADS), 1, figsize=(14, 5 * len(WORKLOADS)))
    for ax, workload in zip(axes, WORKLOADS, strict=True):
        rows = {n: r.get("latency", r) for n, r in out[workload].items()}
        names = list(rows)
        width = 0.27
        for i, q in enumerate(("p50_ms", "p95_ms", "p99_ms")):
            ax.bar([x + i * width for x in range(len(names))], [rows[n].get(q, 0) for n in names], width, label=q)
        ax.set_xticks([x + width for x in range(len(names))], names, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"closed loop: {workload}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=60, help="requests per series (per client with 1 client)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=2, help="the fixed pool's size per worker (--orderings)")
    parser.add_argument("--think", type=float, default=1.0, help="also 1 client with this pause (0: not)")
    parser.add_argument("--orderings", action="store_true", help="also refills during runs, and a fixed pool")
    parser.add_argument("--preload-off", action="store_true", help="also the shipped pool without preloading")
    parser.add_argument("--stack", action="store_true", help="also through the compose stack on :8000")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for workload, (code, _) in WORKLOADS.items():
        floor = summary(native_in_image(code, args.runs))
        out.setdefault(workload, {})["native (python3 -c, in the image)"] = floor
        print(f"  {workload}: native python3 -c in the image: p50 {floor['p50_ms']:.1f}  p95 {floor['p95_ms']:.1f} ms")
    docker_series(args, out)
    with tempfile.TemporaryDirectory(prefix="execbox-loop-") as tmp, redis_server(Path(tmp)) as redis_url:
        for label, (pool, extra, think) in variants(args).items():
            service = Service(args.workers, pool, Path(tmp), redis_url, extra)
            service.pool_total = args.workers * (pool or (1 if extra.get("EXECBOX_POOL__CLASSES") else 0))
            try:
                engine = Engine()
                engine.settle(service)
                if service.pool_total:
                    time.sleep(5)  # a preloading container finishes its imports (no signal reaches the host)
                    idle = engine.pool_container_mib(service.prefix)
                    print(f"  {label}: idle warm container {idle or float('nan'):.1f} MiB")
                    out[f"idle warm container MiB, {label}"] = idle
                series(f"host processes, {label}", service.url, {}, args, out, think)
            finally:
                service.stop()
    if args.stack:
        key = (ROOT / ".run" / "api-key").read_text().strip()
        series("compose stack", "http://127.0.0.1:8000", {"Authorization": f"Bearer {key}"}, args, out)
    print("\nratios (same run):")
    for workload in WORKLOADS:
        rows = out[workload]
        floor = rows["native (python3 -c, in the image)"]["p50_ms"]
        docker_p50 = rows["docker run, 1 client"]["latency"]["p50_ms"]
        for name, row in rows.items():
            if "phases" in row:
                lat = row["latency"]
                print(f"  {workload}: {name}: p50 / native p50 {lat['p50_ms'] / floor:5.2f}, "
                      f"p50 / docker run p50 {lat['p50_ms'] / docker_p50:4.2f}, "
                      f"p95 / own p50 {lat['p95_ms'] / lat['p50_ms']:4.2f}")  # fmt: skip
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "closed_loop.json").write_text(json.dumps(out, indent=2))
    chart(out, results / "closed_loop.png")
    print(f"wrote {results / 'closed_loop.json'} and closed_loop.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
