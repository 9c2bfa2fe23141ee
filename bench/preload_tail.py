"""The preload tail (issue 35, item 4): paced runs through the warm pool, where a run may arrive
while its warm container's interpreter is still importing. A benchmark: it prints figures and
asserts nothing.

Two deployments in one process, on one Redis, with the pool the stack ships (python, 1 to 4 per
worker): `weighed`, the shipped metadata, whose launcher lets such a run wait for the preload when
that is expected to be shorter than a fresh start (costs_ms in sandbox-images/*/metadata.yaml);
and `never waits`, the same metadata without costs_ms, the rule before: such a run always starts
a fresh interpreter and imports for itself. Per pace, workload (compare.py's print(1) and pandas
job) and series: a few warm-up runs, then --runs runs, one starting every --pace-ms (at once when
the previous one took longer); p50 / p95 / p99 as the client measures them, and each of weighed's
figures over never-waits' in the same run. Which series runs first alternates between blocks.

Usage: python bench/preload_tail.py [--runs 40] [--pace-ms 300 600 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from closed_loop import SHIPPED
from compare import ROOT, WORKLOADS, Service, percentile, redis_server, through, timed


def without_costs(directory: Path) -> Path:
    """sandbox-images' metadata with no preload costs: a run that arrives early never waits."""
    for meta in (ROOT / "sandbox-images").glob("*/metadata.yaml"):
        folder = directory / meta.parent.name
        folder.mkdir(parents=True)
        data = yaml.safe_load(meta.read_text())
        (data.get("preload") or {}).pop("costs_ms", None)
        (folder / "metadata.yaml").write_text(yaml.safe_dump(data))
        if (meta.parent / "versions.json").exists():
            shutil.copy(meta.parent / "versions.json", folder / "versions.json")
    return directory


def paced(service: Service, code: str, expected: str, runs: int, warmup: int, pace_s: float) -> dict[str, Any]:
    action = through(service, code, expected)
    times: list[float] = []
    errors = 0
    due = time.monotonic()
    for i in range(warmup + runs):
        time.sleep(max(0.0, due - time.monotonic()))
        due = max(due + pace_s, time.monotonic())
        elapsed, ok = timed(action)
        if i >= warmup:
            times.append(elapsed)
            errors += not ok
    return {f"p{q}": round(percentile(times, q), 1) for q in (50, 95, 99)} | {"errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pace-ms", type=float, nargs="+", default=[300, 600, 1000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="execbox-preload-tail-") as tmp, redis_server(Path(tmp)) as redis_url:
        pool = {"EXECBOX_POOL__CLASSES": SHIPPED}
        series = {
            "weighed": Service(args.workers, 0, Path(tmp), redis_url, pool),
            "never waits": Service(args.workers, 0, Path(tmp), redis_url,
                                   {**pool, "EXECBOX_IMAGES_DIR": str(without_costs(Path(tmp) / "images"))}),
        }  # fmt: skip
        try:
            blocks = [(pace_ms, workload) for pace_ms in args.pace_ms for workload in WORKLOADS]
            for block, (pace_ms, workload) in enumerate(blocks):
                code, expected = WORKLOADS[workload]
                order = list(series.items()) if block % 2 == 0 else list(series.items())[::-1]
                for name, service in order:  # which series goes first alternates from block to block
                    row = paced(service, code, expected, args.runs, args.warmup, pace_ms / 1000)
                    results.setdefault(f"{pace_ms:g} ms", {}).setdefault(workload, {})[name] = row
                    print(f"pace {pace_ms:>5g} ms  {workload:<7} {name:<12} "
                              f"p50 {row['p50']:>6} p95 {row['p95']:>6} p99 {row['p99']:>6} ms  "
                              f"errors {row['errors']}", flush=True)  # fmt: skip
        finally:
            for service in series.values():
                service.stop()
    print("\nweighed over never-waits, same run (p50 / p95 / p99):")
    for pace, workloads in results.items():
        for workload, rows in workloads.items():
            ratios = " / ".join(f"{rows['weighed'][p] / rows['never waits'][p]:.2f}" for p in ("p50", "p95", "p99"))
            print(f"  pace {pace:<8} {workload:<7} {ratios}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "preload_tail.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                            "results": results}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
