"""Where the hand-off between the API and the worker goes: the Redis commands one execution costs,
by process (API, worker) and by command, and the record's own phases, for executions run one at a
time on a settled service (one worker, a warm pool of one, --pause s after the pool refilled, so
that a preloaded interpreter is ready). A benchmark: it prints and asserts nothing.

Redis's MONITOR lists every command with the client's address; `ss` maps each address to the
process that owns it. A blocking command that was waiting when an execution began (the worker's
BLPOP, the API's pub/sub) is counted when it was issued.

Usage: python bench/hot_path.py [--runs 20] [--pause 1] [--language python] [--trace] [--preload-off]
(--trace: every command of the last execution, with its time)
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Engine, Service, redis_server

PROGRAMS = {"python": "print(1)", "javascript": "console.log(1)"}
LINE = re.compile(r'^\d+\.\d+ \[\d+ (?P<addr>[\d.]+:\d+)\] "(?P<cmd>[^"]+)"')


def owners(redis_port: int, service: Service) -> dict[str, str]:
    """Client address (as Redis sees it) -> "api" or "worker"."""
    roles = {str(p.pid): ("api" if i == 0 else "worker") for i, p in enumerate(service.procs)}
    found: dict[str, str] = {}
    done = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{redis_port} )"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    for line in done.stdout.splitlines():
        fields = line.split()
        local = fields[2]
        pid = re.search(r"pid=(\d+)", line)
        if pid and pid.group(1) in roles:
            found[local] = roles[pid.group(1)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--trace", action="store_true", help="print every command of the last execution")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between a settled pool and the next run")
    parser.add_argument("--language", choices=sorted(PROGRAMS), default="python")
    parser.add_argument("--preload-off", action="store_true", help="warm containers without a preloaded interpreter")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execbox-hot-") as tmp, redis_server(Path(tmp)) as redis_url:
        port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
        env = {"EXECBOX_POOL__CLASSES": json.dumps([{"language": args.language, "min": 1, "max": 1}])}
        if args.preload_off:
            env["EXECBOX_POOL__PRELOAD"] = "false"
        service = Service(1, 0, Path(tmp), redis_url, env)
        service.pool_total = 1
        code = PROGRAMS[args.language]

        def run() -> dict[str, Any]:
            body: dict[str, Any] = service.client.post(
                "/v1/executions?wait=60", json={"language": args.language, "code": code}
            ).json()
            return body

        try:
            engine = Engine()
            for _ in range(3):
                run()
            engine.settle(service)
            monitor = subprocess.Popen(["redis-cli", "-p", str(port), "MONITOR"], stdout=subprocess.PIPE, text=True)
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(monitor.stdout or []), daemon=True)
            reader.start()
            time.sleep(0.5)  # MONITOR is listening
            phases = collections.defaultdict(list)
            last = 0
            for i in range(args.runs):
                engine.settle(service, taken=1 if i else 0)
                time.sleep(args.pause)
                last = len(lines)
                began = time.perf_counter()
                body = run()
                phases["client_ms"].append((time.perf_counter() - began) * 1000)
                for key in ("queue_wait_ms", "sandbox_start_ms", "run_ms", "total_ms"):
                    phases[key].append(body["timing"].get(key) or 0.0)
            time.sleep(0.5)
            addresses = owners(port, service)
            monitor.terminate()
            reader.join(5)
        finally:
            service.stop()
    by_role: collections.Counter[str] = collections.Counter()
    by_command: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in lines:
        match = LINE.match(line)
        if not match:
            continue
        role = addresses.get(match["addr"], "other")
        by_role[role] += 1
        by_command[(role, match["cmd"].upper())] += 1
    print(f"{args.runs} executions of {code!r} ({args.language}), one at a time, settled between them "
          f"and {args.pause:g} s apart (pool of 1, 1 worker{', no preload' if args.preload_off else ''})")  # fmt: skip
    for key, values in phases.items():
        print(f"  {key:18} median {statistics.median(values):6.1f} ms")
    print("Redis commands per execution (including the worker's idle heartbeats and polls meanwhile):")
    for role, n in by_role.most_common():
        print(f"  {role:8} {n / args.runs:6.1f}")
    for (role, command), n in by_command.most_common(30):
        print(f"    {role:8} {command:22} {n / args.runs:5.1f}")
    if args.trace:
        print("the last execution's commands:")
        traced = [line for line in lines[last:] if LINE.match(line)]
        began = float(traced[0].split()[0]) if traced else 0.0
        for line in traced:
            match = LINE.match(line)
            assert match is not None
            at = (float(line.split()[0]) - began) * 1000
            print(f"  {at:7.2f} ms {addresses.get(match['addr'], 'other'):7} {line.split(']', 1)[1].strip()[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
