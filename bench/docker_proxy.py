"""What the narrowed Docker socket costs: warm and cold `print(1)` runs through the runtime, straight
to the engine and through `execbox docker-proxy`, alternated in one run. A benchmark: it prints
figures and asserts nothing.

Usage: python bench/docker_proxy.py [--runs 40]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import EXECBOX, summary
from execbox.sandbox.docker import DockerRuntime
from execbox.sandbox.runtime import Limits, SandboxControl, SandboxSpec
from execbox.sandbox.settings import DockerSettings

DEPLOYMENT = "benchproxy"


class _OnePool:
    """A warm container made just before each run (the warm path: attach, frame, result)."""

    def __init__(self) -> None:
        self.container: str | None = None

    def take(self, spec: SandboxSpec) -> str | None:
        taken, self.container = self.container, None
        return taken


def spec(i: int) -> SandboxSpec:
    limits = Limits(10, 1, 20, 256, 64, 64, 1 << 20)
    return SandboxSpec(execution_id=f"exe_bench{i}", trace_id="t", worker="bench",
                       image="execbox/sandbox-python:latest", command=("python3", "main.py"),
                       files=(("main.py", b"print(1)"),), env=(), limits=limits, language="python",
                       deployment=DEPLOYMENT)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execbox-dproxy-") as tmp:
        socket_path = f"{tmp}/docker.sock"
        proxy = subprocess.Popen([EXECBOX, "docker-proxy", "--listen", socket_path, "--deployment", DEPLOYMENT],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            while not os.path.exists(socket_path):
                time.sleep(0.05)  # the proxy's socket appearing is the only sign it is up
            runtimes = {"engine": DockerRuntime(DockerSettings()),
                        "docker-proxy": DockerRuntime(DockerSettings(url=f"unix://{socket_path}"))}  # fmt: skip
            times: dict[str, list[float]] = {f"{n} {kind}": [] for n in runtimes for kind in ("cold", "warm")}
            for i in range(args.runs):
                for name, runtime in runtimes.items():
                    for kind in ("cold", "warm"):
                        pool = _OnePool()
                        runtime.pool = pool  # type: ignore[assignment]
                        if kind == "warm":
                            pool.container = runtime.create_pooled(spec(i), "python")
                            time.sleep(0.3)  # the pooled launcher is up, as in a settled pool
                        start = time.perf_counter()
                        outcome = runtime.run(spec(i), SandboxControl())
                        times[f"{name} {kind}"].append((time.perf_counter() - start) * 1000)
                        assert outcome.stdout == b"1\n", outcome
                        runtime.close()
            rows = {name: summary(values) for name, values in times.items()}
            for name, row in rows.items():
                print(f"{name}: p50 {row['p50_ms']:.1f} ms p95 {row['p95_ms']:.1f} ms")
            for kind in ("cold", "warm"):
                ratio = rows[f"docker-proxy {kind}"]["p50_ms"] / rows[f"engine {kind}"]["p50_ms"]
                print(f"{kind}: docker-proxy/engine p50 {ratio:.2f}")
        finally:
            proxy.terminate()
            proxy.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
