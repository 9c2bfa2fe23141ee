"""execbox against its baselines, in one run on one machine. A benchmark: it prints and writes
figures and asserts nothing.

Series, each for `print(1)` and for a small pandas job:
  a  native      python -c CODE as a local subprocess (the floor)
  b  docker      `docker run --rm` of the sandbox image with the sandbox's hardening
  c  cold        POST /v1/executions?wait through execbox, warm pool off
  d  warm        the same, warm pool on

Latency: p50/p95/p99 over --runs rounds; in each round the series run back to back, and before
the next round the engine is let settle (the last run's container removed, the pool refilled), so
that one series' background work does not land on another's clock. Throughput: executions/s and
errors at each --concurrency for --seconds, for b, c and d, with the API's /healthz latency
sampled meanwhile. Memory: API and worker resident memory at idle and after --memory-runs
executions, and the memory of an idle pool container.

The bench starts its own Redis, API and workers (auth off, a private key prefix and queue, a
per-minute quota that does not throttle it); it needs the engine and the images (`make images`).
Writes bench/results/compare.json and compare.png; prints the ratios c/b, d/a and
throughput(d)/throughput(b).

Usage: python bench/compare.py [--runs 100] [--seconds 60] [--concurrency 1 4 8 16]
       [--workers 2] [--pool 2] [--memory-runs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXECBOX = str(ROOT / ".venv" / "bin" / "execbox")
IMAGE = "execbox/sandbox-python:latest"
HARDENING = [
    "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--user", "65534:65534", "--pids-limit", "64", "--memory", "256m", "--memory-swap", "256m",
    "--cpus", "1", "--init", "--log-driver", "none", "--tmpfs", "/tmp:size=64m",
    "--tmpfs", "/workspace:size=64m", "--ulimit", "nofile=1024:1024",
]  # fmt: skip
WORKLOADS = {
    "print": ("print(1)", "1\n"),
    "pandas": (
        "import pandas as pd\n"
        "df = pd.DataFrame({'g': [i % 7 for i in range(10000)], 'x': range(10000)})\n"
        "print(int(df.groupby('g')['x'].sum().sum()))\n",
        "49995000\n",
    ),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
        "mean_ms": statistics.fmean(values),
        "n": len(values),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Service:
    """A private execbox: Redis, one API, `workers` workers; pool size per worker for python."""

    def __init__(
        self, workers: int, pool: int, logs: Path, redis_url: str, extra_env: dict[str, str] | None = None
    ) -> None:
        self.prefix = f"bench{secrets.token_hex(3)}"
        policies = logs / f"policies-{self.prefix}"
        shutil.copytree(ROOT / "policies", policies)
        tenants = yaml.safe_load((policies / "tenants.yaml").read_text())
        tenants["default"].update(running=10_000, per_minute=1_000_000)
        (policies / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("EXECBOX_")},
            "EXECBOX_REDIS__URL": redis_url,
            "EXECBOX_REDIS__KEY_PREFIX": self.prefix,
            "EXECBOX_QUEUE__NAME": self.prefix,
            "EXECBOX_AUTH__ENABLED": "false",
            "EXECBOX_POLICIES_DIR": str(policies),
            "EXECBOX_ARTIFACTS_DIR": str(logs / f"artifacts-{self.prefix}"),
            "EXECBOX_POOL__SIZES": json.dumps({"python": pool} if pool else {}),
            "EXECBOX_LOG_LEVEL": "WARNING",
            **(extra_env or {}),
        }
        self.pool_total = pool * workers
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs = logs
        self._spawn("api", [EXECBOX, "api", "--port", str(port)])
        for i in range(workers):
            self._spawn(f"worker-{i}", [EXECBOX, "worker", "--name", f"{self.prefix}-worker-{i}"])
        self.client = httpx.Client(base_url=self.url, timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.client.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise SystemExit(f"the bench's execbox did not get ready; logs in {logs}")

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self._logs / f"{self.prefix}-{name}.log", "wb") as log:
            self.procs.append(subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def run(self, code: str, client: httpx.Client | None = None) -> dict[str, Any]:
        body: dict[str, Any] = (
            (client or self.client).post("/v1/executions?wait=60", json={"language": "python", "code": code}).json()
        )
        return body

    def stop(self) -> None:
        self.client.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(60)


class Engine:
    def __init__(self) -> None:
        self.docker = docker.from_env(version="auto")
        self._pooled: dict[str, set[str]] = {}

    def containers(self, prefix: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.docker.api.containers(
            all=True, filters={"label": f"execbox.deployment={prefix}"}
        )
        return found

    def settle(self, service: Service, taken: int = 0, timeout_s: float = 30) -> None:
        """Wait until the service's engine work is done: no run container left, the pool full.
        `taken`: warm runs since the last settle. A taken container keeps its pool label until it
        is removed, so the pool is full only when that many of the last settle's containers are gone."""
        deadline = time.monotonic() + timeout_s
        previous = self._pooled.get(service.prefix, set())
        while time.monotonic() < deadline:
            found = self.containers(service.prefix)
            pooled = {c["Id"] for c in found if "execbox.pool" in (c.get("Labels") or {}) and c["State"] == "running"}
            full = len(found) == len(pooled) == service.pool_total
            if full and len(pooled & previous) <= service.pool_total - taken:
                self._pooled[service.prefix] = pooled
                return
            time.sleep(0.02)

    def pool_container_mib(self, prefix: str) -> float | None:
        sizes = []
        for c in self.containers(prefix):
            if "execbox.pool" in (c.get("Labels") or {}):
                memory = self.docker.api.stats(c["Id"], stream=False).get("memory_stats", {})
                usage = memory.get("usage")
                if usage:
                    sizes.append((usage - memory.get("stats", {}).get("cache", 0)) / (1 << 20))
        return statistics.fmean(sizes) if sizes else None


def native(code: str, expected: str) -> Callable[[], bool]:
    def run() -> bool:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
        return done.stdout.decode() == expected

    return run


def docker_run(code: str, expected: str) -> Callable[[], bool]:
    def run() -> bool:
        done = subprocess.run(
            ["docker", "run", "--rm", *HARDENING, IMAGE, "python3", "-c", code], capture_output=True, check=False
        )
        return done.stdout.decode() == expected

    return run


def through(service: Service, code: str, expected: str) -> Callable[[], bool]:
    local = threading.local()

    def run() -> bool:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=service.url, timeout=120)
        body = service.run(code, local.client)
        return body.get("status") == "succeeded" and body.get("stdout") == expected

    return run


def timed(action: Callable[[], bool]) -> tuple[float, bool]:
    start = time.perf_counter()
    ok = action()
    return (time.perf_counter() - start) * 1000, ok


def latency_phase(engine: Engine, service: Service, series: str, runs: int, results: dict[str, Any]) -> None:
    """Rounds of (service series, native, docker), engine settled between runs."""
    for workload, (code, expected) in WORKLOADS.items():
        actions = {series: through(service, code, expected), "native": native(code, expected),
                   "docker": docker_run(code, expected)}  # fmt: skip
        for action in actions.values():
            action()  # warm-up: page cache, image layers, connections
        engine.settle(service, taken=1 if service.pool_total else 0)  # the warm-up took one
        for _ in range(runs):
            for name, action in actions.items():
                elapsed, ok = timed(action)
                row = results.setdefault(workload, {}).setdefault(name, {"ms": [], "errors": 0})
                if ok:
                    row["ms"].append(elapsed)
                else:
                    row["errors"] += 1
                engine.settle(service, taken=1 if name == series and service.pool_total else 0)


def run_all(threads: list[threading.Thread]) -> float:
    """Start the threads, wait for all of them; the seconds that took."""
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - began


def throughput(action: Callable[[], bool], clients: int, seconds: float, health: str | None) -> dict[str, Any]:
    latencies: list[float] = []
    health_ms: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            elapsed, ok = timed(action)
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors += 1

    def probe() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                http.get(f"{health}/healthz")
                health_ms.append((time.perf_counter() - start) * 1000)
                time.sleep(0.1)  # a steady probe rate, like a load balancer's

    threads = [threading.Thread(target=client) for _ in range(clients)]
    if health:
        threads.append(threading.Thread(target=probe))
    wall = run_all(threads)
    row: dict[str, Any] = {"clients": clients, "per_s": len(latencies) / wall, "errors": errors, **summary(latencies)}
    if health:
        row["healthz"] = summary(health_ms)
    return row


def memory_phase(engine: Engine, service: Service, runs: int) -> dict[str, Any]:
    api, *workers = service.procs
    code, expected = WORKLOADS["print"]
    engine.settle(service)
    idle = {"api_mib": rss_mib(api.pid), "workers_mib": [rss_mib(w.pid) for w in workers]}
    action = through(service, code, expected)
    errors = 0
    lock = threading.Lock()
    left = iter(range(runs))

    def client() -> None:
        nonlocal errors
        for _ in _locked(left, lock):
            if not action():
                with lock:
                    errors += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.settle(service)
    after = {"api_mib": rss_mib(api.pid), "workers_mib": [rss_mib(w.pid) for w in workers]}
    return {"runs": runs, "errors": errors, "idle": idle, "after": after,
            "pool_container_mib": engine.pool_container_mib(service.prefix)}  # fmt: skip


def _locked(items: Iterator[int], lock: threading.Lock) -> Iterator[int]:
    while True:
        with lock:
            item = next(items, None)
        if item is None:
            return
        yield item


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() == b"PONG":
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, workload in zip(axes[:2], WORKLOADS, strict=True):
        rows = results["latency"][workload]
        names = [n for n in ("native", "docker", "cold", "warm") if n in rows]
        width = 0.25
        for i, q in enumerate(("p50_ms", "p95_ms", "p99_ms")):
            ax.bar([x + i * width for x in range(len(names))], [rows[n].get(q, 0) for n in names], width, label=q)
        ax.set_xticks([x + width for x in range(len(names))], names)
        ax.set_ylabel("ms (log)")
        ax.set_yscale("log")
        ax.set_title(f"latency: {workload}")
        ax.legend()
    ax = axes[2]
    for name, rows in results["throughput"].items():
        ax.plot([r["clients"] for r in rows], [r["per_s"] for r in rows], marker="o", label=name)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("executions/s")
    ax.set_title("throughput, print(1)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=2, help="warm containers per worker in the warm phase")
    parser.add_argument("--memory-runs", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    engine = Engine()
    raw: dict[str, Any] = {}
    results: dict[str, Any] = {"machine": {"cores": os.cpu_count()}, "args": {k: str(v) for k, v in vars(args).items()},
                               "latency": {}, "throughput": {}}  # fmt: skip
    code, expected = WORKLOADS["print"]
    with tempfile.TemporaryDirectory(prefix="execbox-bench-") as tmp, redis_server(Path(tmp)) as redis_url:
        logs = Path(tmp)
        for series, pool in (("cold", 0), ("warm", args.pool)):
            service = Service(args.workers, pool, logs, redis_url)
            try:
                print(f"{series}: latency, {args.runs} rounds per workload", flush=True)
                latency_phase(engine, service, series, args.runs, raw)
                rows = results["throughput"].setdefault(series, [])
                for clients in args.concurrency:
                    engine.settle(service)
                    rows.append(throughput(through(service, code, expected), clients, args.seconds, service.url))
                    print(f"{series}: {clients} clients: {rows[-1]['per_s']:.1f}/s", flush=True)
                if series == "warm":
                    print(f"warm: memory over {args.memory_runs} executions", flush=True)
                    results["memory"] = memory_phase(engine, service, args.memory_runs)
            finally:
                service.stop()
        rows = results["throughput"].setdefault("docker", [])
        for clients in args.concurrency:
            rows.append(throughput(docker_run(code, expected), clients, args.seconds, None))
            print(f"docker: {clients} clients: {rows[-1]['per_s']:.1f}/s", flush=True)
    for workload, series_rows in raw.items():
        results["latency"][workload] = {
            name: {**summary(row["ms"]), "errors": row["errors"]} for name, row in series_rows.items()
        }
    lat = results["latency"]["print"]
    by_clients = {name: {r["clients"]: r["per_s"] for r in rows} for name, rows in results["throughput"].items()}
    results["ratios"] = {
        "cold_p50/docker_p50": lat["cold"]["p50_ms"] / lat["docker"]["p50_ms"],
        "warm_p50/native_p50": lat["warm"]["p50_ms"] / lat["native"]["p50_ms"],
        "warm_p99/native_p99": lat["warm"]["p99_ms"] / lat["native"]["p99_ms"],
        "pandas cold_p50/docker_p50": results["latency"]["pandas"]["cold"]["p50_ms"]
        / results["latency"]["pandas"]["docker"]["p50_ms"],
        "pandas warm_p50/native_p50": results["latency"]["pandas"]["warm"]["p50_ms"]
        / results["latency"]["pandas"]["native"]["p50_ms"],
        **{f"throughput warm/docker @{c}": by_clients["warm"][c] / by_clients["docker"][c] for c in args.concurrency},
    }
    (args.out / "compare.json").write_text(json.dumps({"results": results, "raw": raw}, indent=2))
    chart(results, args.out / "compare.png")
    report(results)
    print(f"figures: {args.out / 'compare.json'}, chart: {args.out / 'compare.png'}")
    return 0


def report(results: dict[str, Any]) -> None:
    for workload, rows in results["latency"].items():
        for name, row in rows.items():
            print(f"{workload:7s} {name:7s} p50 {row['p50_ms']:7.1f}  p95 {row['p95_ms']:7.1f}  "
                  f"p99 {row['p99_ms']:7.1f} ms  (n={row['n']}, errors={row['errors']})")  # fmt: skip
    for name, rows in results["throughput"].items():
        for r in rows:
            health = r.get("healthz", {})
            extra = f"  /healthz p99 {health['p99_ms']:.1f} ms" if health.get("n") else ""
            print(f"throughput {name:6s} {r['clients']:2d} clients: {r['per_s']:6.1f}/s  errors {r['errors']}  "
                  f"p50 {r.get('p50_ms', 0):7.1f} ms{extra}")  # fmt: skip
    memory = results.get("memory")
    if memory:
        print(f"memory: API {memory['idle']['api_mib']:.1f} -> {memory['after']['api_mib']:.1f} MiB, workers "
              f"{memory['idle']['workers_mib']} -> {memory['after']['workers_mib']} MiB over {memory['runs']} runs "
              f"({memory['errors']} errors); idle pool container {memory['pool_container_mib']} MiB")  # fmt: skip
    for name, value in results["ratios"].items():
        print(f"{name:32s} {value:6.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
