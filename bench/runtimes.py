"""The sandbox runtimes side by side, in one run: runc, gVisor (runsc) and bubblewrap (bwrap), each
cold (no warm pool: a fresh sandbox per run), and runc with the shipped warm pool for reference.
A benchmark: it prints figures and asserts nothing.

Per series, through execbox's API with `print(1)` (--workload pandas: compare.py's pandas job,
which the warm pool's preloaded interpreter has imported ahead): the sandbox's own start (the result's
`timing.start_ms`, median); closed-loop latency p50/p95 with 1 client and with --clients clients
(each client sends its next request when the last answers); executions per second at --clients,
and per core. Then idle memory: the resident memory of what each runtime keeps running on the
host when nothing runs (dockerd and containerd for the Docker runtimes, the bubblewrap helper for
bwrap). Ratios are against runc cold (the first series when --runtimes leaves it out), measured in the
same process.

Starts its own Redis, API, workers and bubblewrap helper (as root); needs `make engine` (which
registers runsc), the images, and bubblewrap (scripts/install).

Usage: python bench/runtimes.py [--runs 40] [--seconds 15] [--clients 8] [--workers 2] [--workload print]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import EXECBOX, ROOT, WORKLOADS, Service, redis_server, summary

ENGINE = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def _rss_kib(status: Path) -> tuple[str, int]:
    """A process's name and resident memory (KiB) from its /proc status; ("", 0) once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
    except OSError:
        return "", 0
    return fields.get("Name", "").strip(), int(fields.get("VmRSS", "0 kB").split()[0])


def rss_mb(names: set[str]) -> float:
    """Resident memory of every process whose name is in `names`, in MiB."""
    found = (_rss_kib(status) for status in Path("/proc").glob("[0-9]*/status"))
    return sum(kib for name, kib in found if name in names) / 1024


def closed_loop(url: str, request: dict[str, Any], expected: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` clients, each sending its next request when the last answered, for `seconds`."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < stop:
                start = time.perf_counter()
                answer = http.post("/v1/executions?wait=60", json=request).json()
                took = (time.perf_counter() - start) * 1000
                with lock:
                    if answer.get("stdout") == expected:
                        latencies.append(took)
                    else:
                        errors[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    return {**summary(latencies), "per_s": len(latencies) / elapsed, "errors": errors[0]}


def series(service: Service, runtime: str | None, args: argparse.Namespace) -> dict[str, Any]:
    code, expected = WORKLOADS[args.workload]
    request: dict[str, Any] = {"language": "python", "code": code}
    if runtime:
        request["policy"] = {"runtime": runtime}
    starts = []
    with httpx.Client(base_url=service.url, timeout=300) as http:
        for _ in range(3):  # warm-up: the first bwrap run of an image waits while the helper unpacks it
            http.post("/v1/executions?wait=300", json=request)
        for _ in range(args.runs):
            answer = http.post("/v1/executions?wait=60", json=request).json()
            starts.append(float((answer.get("timing") or {}).get("sandbox_start_ms") or 0.0))
    one = closed_loop(service.url, request, expected, 1, args.seconds)
    many = closed_loop(service.url, request, expected, args.clients, args.seconds)
    return {"start_ms": statistics.median(starts), "one": one, "many": many}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40, help="runs whose start is read, per series")
    parser.add_argument("--seconds", type=float, default=15, help="each closed-loop round's length")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workload", choices=list(WORKLOADS), default="print")
    parser.add_argument("--runtimes", nargs="+", choices=["runc", "runsc", "bwrap"], default=["runc", "runsc", "bwrap"])
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="execbox-runtimes-") as tmp, redis_server(Path(tmp)) as redis_url:
        socket_path = Path(tmp) / "bwrap.sock"
        helper = subprocess.Popen([EXECBOX, "bwrap-helper", "--socket", str(socket_path), "--engine", ENGINE,
                                   "--seccomp", str(ROOT / "policies" / "seccomp.json")],
                                  stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "helper.log", "wb"))  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while not socket_path.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            cold = Service(args.workers, 0, Path(tmp), redis_url, {"EXECBOX_DOCKER__BWRAP_SOCKET": str(socket_path)})
            try:
                for runtime in args.runtimes:
                    rows[f"{runtime} (cold)"] = series(cold, runtime, args)
                    print(_line(f"{runtime} (cold)", rows[f"{runtime} (cold)"], args.clients, cores), flush=True)
            finally:
                cold.stop()
            # After their runs, with nothing running: what each runtime keeps resident on the host.
            idle = {"docker (dockerd, containerd)": rss_mb({"dockerd", "containerd"}),
                    "bwrap (its helper)": _rss_kib(Path(f"/proc/{helper.pid}/status"))[1] / 1024}  # fmt: skip
            warm = Service(args.workers, 2, Path(tmp), redis_url)
            try:
                rows["runc (warm pool of 2 per worker)"] = series(warm, None, args)
                print(_line("runc (warm pool of 2 per worker)", rows["runc (warm pool of 2 per worker)"],
                            args.clients, cores), flush=True)  # fmt: skip
            finally:
                warm.stop()
        finally:
            helper.terminate()
            helper.wait(10)
    base_name = "runc (cold)" if "runc (cold)" in rows else next(iter(rows))
    base = rows[base_name]
    print(f"\nratios to {base_name}, same process; {cores} cores")
    for name, row in rows.items():
        print(f"  {name:34} start {row['start_ms'] / base['start_ms']:.2f}×  p50 at 1 client "
              f"{row['one']['p50_ms'] / base['one']['p50_ms']:.2f}×  throughput at {args.clients} "
              f"{row['many']['per_s'] / base['many']['per_s']:.2f}×")  # fmt: skip
    print("idle memory: " + "; ".join(f"{name} {mb:.0f} MiB" for name, mb in idle.items()))
    return 0


def _line(name: str, row: dict[str, Any], clients: int, cores: int) -> str:
    one, many = row["one"], row["many"]
    return (
        f"{name}: sandbox start {row['start_ms']:.0f} ms; 1 client p50 {one['p50_ms']:.0f} / p95 "
        f"{one['p95_ms']:.0f} ms; {clients} clients p50 {many['p50_ms']:.0f} / p95 {many['p95_ms']:.0f} ms, "
        f"{many['per_s']:.1f}/s ({many['per_s'] / cores:.1f}/s per core), errors {one['errors'] + many['errors']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
