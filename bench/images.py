"""The sandbox images' sizes and the import time of the data stack's heavy packages, in one run.
A benchmark: it prints figures and asserts nothing.

Sizes are the engine's (all layers, uncompressed). Import times are measured inside one container
of each python image (no network, read-only root, the sandbox user), each import in a fresh
interpreter, --runs times; the baseline is a bare interpreter start in the same container, so the
ratios say what an import adds to a run that makes it. Needs the images (make images).

Usage: python bench/images.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess

import docker

HEAVY = ["numpy", "pandas", "scipy.stats", "sklearn.linear_model", "matplotlib.pyplot", "seaborn", "statsmodels.api",
         "pyarrow", "duckdb", "sympy", "IPython"]  # fmt: skip
PYTHON_IMAGES = {"python": "execbox/sandbox-python:latest", "python@slim": "execbox/sandbox-python-slim:latest"}

# Run inside the sandbox image: every module in a fresh interpreter, wall time per start.
PROBE = """
import json, statistics, subprocess, sys, time
runs, names = int(sys.argv[1]), sys.argv[2:]
def start(code):
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True)
        times.append((time.perf_counter() - begin) * 1000)
        if done.returncode:
            return None
    return statistics.median(times)
result = {"(bare interpreter)": start("pass")}
for name in names:
    result[name] = start(f"import {name}")
print(json.dumps(result))
"""


def measure(image: str, runs: int) -> dict[str, float | None]:
    argv = ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--user", "65534:65534",
            "--memory", "1g", "-e", "MPLBACKEND=Agg", "-e", "PATH=/opt/python/bin:/usr/bin:/bin",
            image, "python3", "-c", PROBE, str(runs), *HEAVY]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    result: dict[str, float | None] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    client = docker.from_env()
    print("image sizes (uncompressed, all layers):")
    sizes = {tag: img.attrs["Size"] for img in client.images.list() for tag in img.tags}
    for image in sorted(tag for tag in sizes if tag.startswith("execbox/sandbox-")):
        print(f"  {image:42} {sizes[image] / 1e6:7.0f} MB")
    measured: dict[str, dict[str, float | None]] = {}
    for language, image in PYTHON_IMAGES.items():
        times = measured[language] = measure(image, args.runs)
        base = times["(bare interpreter)"] or 1.0
        print(f"\n{language} ({image}), median of {args.runs} fresh interpreters:")
        for name, ms in times.items():
            shown = "not installed" if ms is None else f"{ms:7.1f} ms  ({ms / base:5.1f}x the bare start)"
            print(f"  {name:24} {shown}")
    default = measured["python"]
    total = math.fsum(v for k, v in default.items() if v is not None and k != "(bare interpreter)")
    print(f"\npython: the heavy imports, each alone, add up to {total:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
