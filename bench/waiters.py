"""Many concurrent waiting clients: what agents do (POST ?wait=S and hold the connection). A
benchmark: it prints figures and asserts nothing.

For each --clients N: N clients post code that sleeps --sleep seconds with ?wait=--wait at once,
while /healthz is probed every 50 ms from a process of its own (as an orchestrator would). Prints the
answers' latency p50/p99 and their status codes, /healthz p50/p99/max, and the API's resident
memory and open file descriptors before and after. The bench starts its own Redis, API and
--workers workers (auth off, a quota that does not throttle), like bench/compare.py.

Usage: python bench/waiters.py [--clients 100 1000] [--workers 2] [--wait 30] [--sleep 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, rss_mib, summary

PROBE = """
import json, sys, threading, time
import httpx
stopped = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
probes = []
with httpx.Client(base_url=sys.argv[1], timeout=30) as health:
    print("ready", flush=True)
    while not stopped.wait(0.05):
        start = time.monotonic()
        health.get("/healthz")
        probes.append((time.monotonic() - start) * 1000)
print(json.dumps(probes))
"""
"""/healthz probed every 50 ms until stdin closes, then every probe's milliseconds as JSON."""


def cpu_ticks(pid: int) -> tuple[int, int, int]:
    """(the machine's busy ticks, all its ticks, the process's user + system ticks)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    own = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(fields) - idle, sum(fields), int(own[11]) + int(own[12])


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def idle_probes(service: Service, seconds: float) -> dict[str, float]:
    """/healthz with nothing else going on: the baseline, in the same run."""
    probes = []
    with httpx.Client(base_url=service.url, timeout=30) as health:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            start = time.monotonic()
            health.get("/healthz")
            probes.append((time.monotonic() - start) * 1000)
            time.sleep(0.05)
    return summary(probes)


def one_round(service: Service, clients: int, wait_s: float, sleep_s: float) -> dict[str, Any]:
    api_pid = service.procs[0].pid
    before = {"rss_mib": rss_mib(api_pid), "fds": open_fds(api_pid)}
    # The probe runs in a process of its own: in this one it would share the GIL with the
    # clients' event loop and time that, not the API (the first figures of issue 35 did).
    prober = subprocess.Popen([sys.executable, "-c", PROBE, service.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert prober.stdout is not None and prober.stdout.readline().strip() == "ready"

    async def waiters() -> list[tuple[float, int | str]]:
        limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
        body = {"language": "python", "code": f"import time\ntime.sleep({sleep_s})\nprint('ok')"}
        async with httpx.AsyncClient(base_url=service.url, timeout=wait_s + 60, limits=limits) as client:

            async def one() -> tuple[float, int | str]:
                start = time.monotonic()
                try:
                    answer = await client.post(f"/v1/executions?wait={wait_s}", json=body)
                    ok = answer.status_code == 202 or (answer.status_code == 200 and answer.json()["stdout"] == "ok\n")
                    return (time.monotonic() - start) * 1000, answer.status_code if ok else "wrong answer"
                except httpx.HTTPError as exc:
                    return (time.monotonic() - start) * 1000, type(exc).__name__

            return list(await asyncio.gather(*(one() for _ in range(clients))))

    busy0, all0, api0 = cpu_ticks(api_pid)
    try:
        answers = asyncio.run(waiters())
    finally:
        probed, _ = prober.communicate("")  # its stdin closes: it stops and prints its probes
    busy1, all1, api1 = cpu_ticks(api_pid)
    probes = json.loads(probed)
    cores = os.cpu_count() or 1
    after = {"rss_mib": rss_mib(api_pid), "fds": open_fds(api_pid)}
    return {
        "clients": clients,
        "answers": summary([ms for ms, _ in answers]),
        "statuses": dict(Counter(str(status) for _, status in answers)),
        "healthz": {**summary(probes), "max_ms": max(probes) if probes else None},
        # What bounds /healthz: a machine with no idle core delays every process, the API's included.
        "machine_busy_pct": round(100 * (busy1 - busy0) / max(all1 - all0, 1), 1),
        "api_cpu_pct_of_one_core": round(100 * cores * (api1 - api0) / max(all1 - all0, 1), 1),
        "api_before": before,
        "api_after": after,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--wait", type=float, default=30)
    parser.add_argument("--sleep", type=float, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execbox-waiters-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url)
        try:
            idle = idle_probes(service, 3.0)
            print(f"baseline, no clients: /healthz p50 {idle['p50_ms']:.1f} ms p99 {idle['p99_ms']:.1f} ms "
                  f"over {idle['n']} probes", flush=True)  # fmt: skip
            for clients in args.clients:
                row = one_round(service, clients, args.wait, args.sleep)
                a, h = row["answers"], row["healthz"]
                print(f"{clients} waiting clients: answers p50 {a['p50_ms']:.0f} ms p99 {a['p99_ms']:.0f} ms "
                      f"{row['statuses']}; /healthz p50 {h['p50_ms']:.1f} ms p99 {h['p99_ms']:.1f} ms "
                      f"max {h['max_ms']:.1f} ms over {h['n']} probes; machine busy {row['machine_busy_pct']}%, "
                      f"API {row['api_cpu_pct_of_one_core']}% of a core; API {row['api_before']} -> {row['api_after']}",
                      flush=True)  # fmt: skip
                print(f"  ratio /healthz p99 under load / idle: {h['p99_ms'] / idle['p99_ms']:.1f}", flush=True)
        finally:
            service.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
