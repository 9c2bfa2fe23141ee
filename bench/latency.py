"""End-to-end latency of print(1) through execbox next to its baselines, in one run.

Measures, interleaved round by round so that machine noise hits every series alike:
  native   python3 -c 'print(1)' as a local subprocess (the floor)
  docker   `docker run --rm` of the sandbox image with the sandbox's hardening flags
  execbox  POST /v1/executions?wait=30 against a running service (`make up`)
and prints p50/p95 of each plus the ratios execbox/docker and execbox/native. Not a test:
it asserts nothing. Usage: python bench/latency.py [--url URL] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

IMAGE = "execbox/sandbox-python:latest"
HARDENED_RUN = [
    "docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges", "--user", "65534:65534", "--pids-limit", "64",
    "--memory", "256m", "--memory-swap", "256m", "--cpus", "1", "--init", "--log-driver", "none",
    "--tmpfs", "/tmp:size=64m", "--tmpfs", "/workspace:size=64m", "--ulimit", "nofile=1024:1024",
    IMAGE, "python3", "-c", "print(1)",
]  # fmt: skip


def auth_header() -> dict[str, str]:
    """The local API key `make up` wrote (or $EXECBOX_API_KEY); none when auth is off."""
    key_file = Path(__file__).resolve().parents[1] / ".run" / "api-key"
    key = os.environ.get("EXECBOX_API_KEY") or (key_file.read_text().strip() if key_file.exists() else "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", type=Path, default=Path("bench/results/latency.json"))
    args = parser.parse_args()

    client = httpx.Client(base_url=args.url, timeout=60, headers=auth_header())
    if client.get("/readyz").status_code != 200:
        print(f"execbox at {args.url} is not ready; start it with `make up`", file=sys.stderr)
        return 1

    def native() -> None:
        subprocess.run([sys.executable, "-c", "print(1)"], check=True, capture_output=True)

    def docker_run() -> None:
        out = subprocess.run(HARDENED_RUN, check=True, capture_output=True).stdout
        assert out == b"1\n", out

    def execbox() -> None:
        body = client.post("/v1/executions?wait=30", json={"language": "python", "code": "print(1)"}).json()
        assert body["status"] == "succeeded" and body["stdout"] == "1\n", body

    series: dict[str, list[float]] = {"native": [], "docker": [], "execbox": []}
    actions = {"native": native, "docker": docker_run, "execbox": execbox}
    for action in actions.values():  # warm-up: page cache, image layers, connection pools
        action()
    for _ in range(args.runs):
        for name, action in actions.items():
            series[name].append(timed(action))

    summary = {
        name: {"p50_ms": percentile(v, 50), "p95_ms": percentile(v, 95), "mean_ms": statistics.fmean(v), "n": len(v)}
        for name, v in series.items()
    }
    ratios = {
        "execbox_p50/docker_p50": summary["execbox"]["p50_ms"] / summary["docker"]["p50_ms"],
        "execbox_p95/docker_p95": summary["execbox"]["p95_ms"] / summary["docker"]["p95_ms"],
        "execbox_p50/native_p50": summary["execbox"]["p50_ms"] / summary["native"]["p50_ms"],
    }
    for name, row in summary.items():
        print(f"{name:8s} p50 {row['p50_ms']:7.1f} ms   p95 {row['p95_ms']:7.1f} ms   (n={row['n']})")
    for name, value in ratios.items():
        print(f"{name:24s} {value:5.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": summary, "ratios": ratios, "runs": series}, indent=2))
    print(f"raw figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
