"""Where a cold start's create + start go: the engine's time for execbox's full sandbox settings, and
for the same with one protection left out at a time, in one run. A benchmark: it prints figures and
asserts nothing (and it leaves nothing out of execbox: the variants exist only here).

Each round creates, starts and removes one container per variant, in turn, with `/bin/true` as
the program (its run is not what is measured). The settings come from execbox's own
`host_config_kwargs`, so "full" is what a worker asks for. Prints the median of create, start and
remove per variant and each variant's share of the full start.

Usage: python bench/cold_path.py [--rounds 20] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

from execbox.sandbox.docker.hostconfig import MASKED_PATHS, host_config_kwargs
from execbox.sandbox.runtime import Limits, SandboxSpec
from execbox.sandbox.seccomp import SeccompProfiles
from execbox.sandbox.settings import DockerSettings

ROOT = Path(__file__).resolve().parents[1]

IMAGE = "execbox/sandbox-python:latest"
LABEL = {"execbox.bench": "cold_path"}
UNMASKED = "no masked /proc and /sys paths"


def spec() -> SandboxSpec:
    limits = Limits(30.0, 1.0, 30, 256, 64, 64, 1 << 20)
    return SandboxSpec(execution_id="", trace_id="", worker="bench", image=IMAGE, command=("true",), files=(),
                   env=(), limits=limits, language="python", deployment="bench-cold-path", runtime="runc")  # fmt: skip


def unchanged(kwargs: dict[str, Any]) -> None:
    pass


def variants() -> dict[str, Callable[[dict[str, Any]], None]]:
    def without(*keys: str) -> Callable[[dict[str, Any]], None]:
        def change(kwargs: dict[str, Any]) -> None:
            for key in keys:
                kwargs.pop(key, None)

        return change

    def plain_tmpfs_workspace(kwargs: dict[str, Any]) -> None:
        kwargs.pop("mounts")
        kwargs["tmpfs"] = {**kwargs["tmpfs"], "/workspace": "size=64m,mode=0755,nosuid,nodev"}

    def default_seccomp(kwargs: dict[str, Any]) -> None:
        kwargs["security_opt"] = ["no-new-privileges"]

    return {
        "full (what a worker asks for)": unchanged,
        "workspace as a plain tmpfs, not a volume": plain_tmpfs_workspace,
        "the engine's default seccomp profile": default_seccomp,
        UNMASKED: unchanged,
        "no ulimits": without("ulimits"),
        "no private cgroup namespace": without("cgroupns"),
        "no /tmp tmpfs": without("tmpfs"),
        "no memory, pids or CPU limits": without(
            "mem_limit", "memswap_limit", "pids_limit", "cpu_period", "cpu_quota"
        ),  # fmt: skip
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--image", default=IMAGE, help="also this image, full settings (e.g. one of fewer layers)")
    args = parser.parse_args()
    api = docker.APIClient(version="auto")
    seccomp = SeccompProfiles(ROOT / "policies" / "seccomp.json").json((), gvisor=False)
    run = spec()
    changes = variants()
    images = dict.fromkeys(changes, IMAGE)
    if args.image != IMAGE:
        images[f"full, {args.image}"] = args.image
    times: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for name, image in images.items():
            change = changes.get(name, unchanged)
            kwargs = host_config_kwargs(run, DockerSettings(), 250000, seccomp)
            change(kwargs)
            host_config = api.create_host_config(**kwargs)
            if name != UNMASKED:
                host_config["MaskedPaths"] = list(MASKED_PATHS)
            row = times.setdefault(name, {"create": [], "start": [], "remove": []})
            t0 = time.perf_counter()
            cid = api.create_container(image, ["true"], user="250000:250000", labels=LABEL,
                                       host_config=host_config)["Id"]  # fmt: skip
            t1 = time.perf_counter()
            api.start(cid)
            t2 = time.perf_counter()
            api.wait(cid, timeout=30)
            t3 = time.perf_counter()
            api.remove_container(cid, force=True, v=True)
            t4 = time.perf_counter()
            row["create"].append((t1 - t0) * 1000)
            row["start"].append((t2 - t1) * 1000)
            row["remove"].append((t4 - t3) * 1000)
    full = times["full (what a worker asks for)"]
    full_total = statistics.median(full["create"]) + statistics.median(full["start"])
    print(f"create + start + remove of /bin/true, median of {args.rounds} rounds (ms):")
    for name, row in times.items():
        create, start, remove = (statistics.median(row[k]) for k in ("create", "start", "remove"))
        print(f"  {name:42} create {create:6.1f}  start {start:6.1f}  remove {remove:6.1f}  "
              f"create+start / full {(create + start) / full_total:4.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
