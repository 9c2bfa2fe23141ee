"""execbox beside its peers (issue 35): print(1) and compare.py's pandas job through execbox and
other ways of running code in a container, all on one image (execbox/sandbox-python), one client,
in one run. A benchmark: it prints and writes figures and asserts nothing.

Series (--series picks some; the table says next to each what it isolates):
  native      python -c CODE on the host, the .venv's interpreter: no sandbox, the floor
  execbox     POST /v1/executions?wait through execbox's HTTP API, warm pool on (preloaded), as
              compare.py's warm series; the bench starts its own Redis, API and workers
  docker      `docker run --rm` of the image with compare.py's hardening
  epicbox     epicbox 1.1.0: a new container per run
  llm-pooled  llm-sandbox 0.3.46, its container pool: one container, reused by every run
  llm-fresh   llm-sandbox 0.3.46: a new session (a new container) per run
The peers are installed into .venv-peers (made here from PyPI when missing or out of date); each
of their series runs in a long-lived bench/peers_runner.py process of that environment, which
says how each peer is set up for this image.

Rounds: in each, every series runs once, in an order that rotates and reverses every other round
(no series always follows the same one); --warmup rounds first, not counted. Two modes: closed
(each run starts as soon as the previous one, of any series, answered; nobody lets the engine
settle, as in bench/closed_loop.py) and paced (one run starts every --pace-ms). Figures: p50 / p95
per series, program and mode, and p50 over execbox's p50 in the same column.

At the end, also on Ctrl-C or an error: the peers' runners close (llm-sandbox's pool removes its
container), execbox stops, and every container left from this run is removed: those labelled with
this run's id (docker, llm-sandbox), epicbox's (it labels nothing: named epicbox-*, from the
image, created since the start) and execbox's (its deployment label).

Writes bench/results/peers.json. Needs the engine and the images (`make images`); `make bench-peers`.

Usage: python bench/peers.py [--runs 30] [--warmup 3] [--pace-ms 500] [--modes closed paced]
       [--series native execbox docker epicbox llm-pooled llm-fresh] [--workers 2] [--pool 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import docker
from docker.errors import DockerException, ImageNotFound

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import HARDENING, IMAGE, WORKLOADS, Service, native, redis_server, summary, through
from peers_runner import VERSIONS, ensure_venv

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().parent / "peers_runner.py"
PEERS_VENV = ROOT / ".venv-peers"
LABEL = "org.execbox.bench-peers"
PEER_OF = {"epicbox": "epicbox", "llm-pooled": "llm-sandbox", "llm-fresh": "llm-sandbox"}
TITLES = {
    "native": "native python3 (no sandbox)",
    "execbox": "execbox (HTTP API, warm pool, preloaded)",
    "docker": "`docker run --rm`",
    "epicbox": "epicbox {version} (fresh container)",
    "llm-pooled": "llm-sandbox {version}, container pool",
    "llm-fresh": "llm-sandbox {version}, fresh container",
}
# What each series isolates, from its code (bench/peers_runner.py's docstring says where).
ISOLATION = {
    "native": "none: a process of the host, as the bench's user, with the host's files and network",
    "execbox": "a new container per run (started ahead in the warm pool, removed after its one run); its own "
    "uid, no network, read-only root, all capabilities dropped, no-new-privileges, execbox's seccomp "
    "profile; 256 MiB, 64 pids, 1 CPU, 20 s of CPU (policies/default.yaml)",
    "docker": "a new container per run, removed after it; uid 65534, no network, read-only root, all "
    "capabilities dropped, no-new-privileges, Docker's default seccomp; 256 MiB, 64 pids, 1 CPU",
    "epicbox": "a new container per run, removed after it; root, network disabled, writable root, Docker's "
    "default capabilities and seccomp; 256 MiB and 20 s of CPU (set by the bench, as execbox's policy; "
    "epicbox's defaults are 64 MiB and 1 s), no pids limit",
    "llm-pooled": "one container reused by every run (each run's script stays in /sandbox: what a run "
    "leaves, the next finds); root, Docker's default network (bridge), writable root, Docker's default "
    "capabilities; no memory, CPU or pids limits",
    "llm-fresh": "a new container per run, stopped and removed after it; root, Docker's default network "
    "(bridge), writable root, Docker's default capabilities; no memory, CPU or pids limits",
}
PROGRAM_TITLES = {"print": "print(1)", "pandas": "pandas job"}


class Series(Protocol):
    name: str
    title: str

    def run(self, program: str) -> tuple[float, str | None]: ...


class Local:
    """A series the bench runs in its own process: per program, a call that answers None or why it failed."""

    def __init__(self, name: str, actions: dict[str, Callable[[], str | None]]) -> None:
        self.name, self.title, self.actions = name, TITLES[name], actions

    def run(self, program: str) -> tuple[float, str | None]:
        start = time.perf_counter()
        failure = self.actions[program]()
        return (time.perf_counter() - start) * 1000, failure


class Peer:
    """A series in a bench/peers_runner.py process of .venv-peers; times are taken there."""

    def __init__(self, name: str, run_id: str, logs: Path) -> None:
        self.name, self.title = name, TITLES[name]
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("wb")
        argv = [str(PEERS_VENV / "bin" / "python"), str(RUNNER), "--series", name, "--image", IMAGE,
                "--label", f"{LABEL}={run_id}", "--programs", json.dumps(WORKLOADS)]  # fmt: skip
        # A session of its own: Ctrl-C reaches the bench only, which then lets the runner clean up.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, start_new_session=True)  # fmt: skip

    def ask(self, line: str, timeout_s: float = 300) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            self.proc.kill()  # a late answer would be taken for the next one's
            raise TimeoutError(f"no answer to {line!r} within {timeout_s:.0f} s")
        answer = self.proc.stdout.readline()
        if not answer:
            self._log.flush()
            raise EOFError(f"the runner exited: {self.log_path.read_text(errors='replace')[-400:]}")
        return answer.strip()

    def hello(self) -> str | None:
        """Fills in the title with the peer's version; answers why the series cannot run, if it cannot."""
        try:
            answer = self.ask("hello", timeout_s=60)
        except (OSError, TimeoutError, EOFError) as exc:
            return str(exc)
        if not answer.startswith("ok "):
            return answer.removeprefix("error ")
        self.version = json.loads(answer[3:])["version"]
        self.title = TITLES[self.name].format(version=self.version)
        if self.version != VERSIONS[PEER_OF[self.name]]:
            print(f"{self.name}: {PEER_OF[self.name]} {self.version}, not the pinned {VERSIONS[PEER_OF[self.name]]}")
        return None

    def run(self, program: str) -> tuple[float, str | None]:
        start = time.perf_counter()
        try:
            answer = self.ask(f"run {program}")
        except (OSError, TimeoutError, EOFError) as exc:
            return (time.perf_counter() - start) * 1000, str(exc)
        if answer.startswith("ok "):
            return float(answer[3:]), None
        return (time.perf_counter() - start) * 1000, answer.removeprefix("error ")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(120)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)
        finally:
            self._log.close()


def docker_action(code: str, expected: str, run_id: str) -> Callable[[], str | None]:
    """compare.py's `docker run --rm` with the sandbox's hardening, labelled with this run's id."""
    argv = ["docker", "run", "--rm", "--label", f"{LABEL}={run_id}", *HARDENING, IMAGE, "python3", "-c", code]

    def run() -> str | None:
        done = subprocess.run(argv, capture_output=True, check=False)
        if done.stdout.decode() == expected:
            return None
        return f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"

    return run


def stop_service(service: Service) -> None:
    if hasattr(service, "client"):
        service.stop()
        return
    for proc in getattr(service, "procs", []):  # it failed before it was ready
        proc.kill()
        proc.wait(10)


def checked(action: Callable[[], bool]) -> Callable[[], str | None]:
    return lambda: None if action() else "failed, or printed something else"


def sweep(engine: docker.DockerClient, run_id: str, since: int, deployments: list[str]) -> int:
    """Removes every container this run left; answers how many."""
    api = engine.api
    found = api.containers(all=True, filters={"label": f"{LABEL}={run_id}"})
    found += [c for c in api.containers(all=True, filters={"name": "epicbox-", "ancestor": IMAGE})
              if c["Created"] >= since and any(n.startswith("/epicbox-") for n in c["Names"])]  # fmt: skip
    for prefix in deployments:
        found += api.containers(all=True, filters={"label": f"execbox.deployment={prefix}"})
    for container in found:
        try:  # v: with its anonymous volumes (execbox's workspace)
            api.remove_container(container["Id"], force=True, v=True)
        except DockerException as exc:
            print(f"could not remove container {container['Id'][:12]}: {exc}", file=sys.stderr)
    return len({c["Id"] for c in found})


def turn(items: list[Series], round_no: int) -> list[Series]:
    """Round r's order: rotated by r, reversed in odd rounds."""
    k = round_no % len(items)
    turned = items[k:] + items[:k]
    return turned[::-1] if round_no % 2 else turned


@dataclass
class Row:
    """One series' runs of one program in one mode."""

    ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {**summary(self.ms), "errors": self.errors, "first_error": self.first_error, "ms": self.ms}


def measure(series: list[Series], program: str, mode: str, args: argparse.Namespace,
            rows: dict[tuple[str, str, str], Row], dropped: dict[str, str]) -> None:  # fmt: skip
    """--warmup then --runs rounds of `program`, every series once a round; a series none of whose
    warm-up runs succeeded is dropped (with the reason in `dropped`) for the rest of the bench."""
    warm_ok: dict[str, int] = {}
    next_start = time.monotonic()
    for round_no in range(args.warmup + args.runs):
        if round_no == args.warmup and args.warmup:
            for s in series:
                if not warm_ok.get(s.name) and s.name not in dropped:
                    dropped[s.name] = f"every warm-up run failed: {rows[s.name, mode, program].first_error}"
                    print(f"{s.name}: dropped, {dropped[s.name]}", flush=True)
        active = [s for s in series if s.name not in dropped]
        for s in turn(active, round_no) if active else []:
            if mode == "paced":
                time.sleep(max(0.0, next_start - time.monotonic()))
                next_start = time.monotonic() + args.pace_ms / 1000
            elapsed, failure = s.run(program)
            row = rows[s.name, mode, program]
            if failure is not None and row.first_error is None:
                row.first_error = failure
                print(f"{s.name}: {PROGRAM_TITLES[program]} failed: {failure}", flush=True)
            if round_no < args.warmup:
                warm_ok[s.name] = warm_ok.get(s.name, 0) + (failure is None)
            elif failure is None:
                row.ms.append(elapsed)
            else:
                row.errors += 1


def cell(row: dict[str, Any], base: float | None) -> str:
    if not row["n"]:
        return f"failed: {row['first_error']}" if row["first_error"] else "-"
    text = f"{row['p50_ms']:.0f} / {row['p95_ms']:.0f}"
    if base:
        text += f" ({row['p50_ms'] / base:.1f}x)"
    return text + (f", {row['errors']} errors" if row["errors"] else "")


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    columns = [(m, p) for m in args.modes for p in WORKLOADS]
    heads = [f"{'closed' if m == 'closed' else f'paced {args.pace_ms:.0f} ms'}: {PROGRAM_TITLES[p]} p50 / p95 ms"
             for m, p in columns]  # fmt: skip
    print(f"\n{args.runs} runs per series after {args.warmup} warm-up, interleaved rounds, one client, on {IMAGE}; "
          "(n x): p50 over execbox's p50 in the same column\n")  # fmt: skip
    print("| one client | " + " | ".join(heads) + " | isolation |")
    print("|---" * (len(heads) + 2) + "|")
    base = results["series"].get("execbox", {}).get("modes", {})
    for row in results["series"].values():
        if row["skipped"]:
            print(f"| {row['title']} | " + " | ".join(["-"] * len(heads)) + f" | not run: {row['skipped']} |")
            continue
        cells = []
        for mode, program in columns:
            execbox_p50 = base.get(mode, {}).get(program, {}).get("p50_ms")
            cells.append(cell(row["modes"][mode][program], execbox_p50))
        note = f"dropped: {row['dropped']}; " if row["dropped"] else ""
        print(f"| {row['title']} | " + " | ".join(cells) + f" | {note}{row['isolation']} |")


def start_series(stack: ExitStack, args: argparse.Namespace, run_id: str, logs: Path, skipped: dict[str, str],
                 deployments: list[str]) -> list[Series]:  # fmt: skip
    """The chosen series, ready; what cannot run goes to `skipped` with the reason. Whatever they
    start is stopped when `stack` closes."""
    chosen = [name for name in TITLES if name in args.series]
    actions: dict[str, dict[str, Callable[[], str | None]]] = {"native": {}, "docker": {}, "execbox": {}}
    if "execbox" in chosen:
        redis_url = stack.enter_context(redis_server(logs))
        # Registered before it starts its processes: they are stopped also if it never gets ready.
        service = Service.__new__(Service)
        stack.callback(stop_service, service)
        Service.__init__(service, args.workers, args.pool, logs, redis_url)
        deployments.append(service.prefix)
    for program, (code, expected) in WORKLOADS.items():
        actions["native"][program] = checked(native(code, expected))
        actions["docker"][program] = docker_action(code, expected, run_id)
        if "execbox" in chosen:
            actions["execbox"][program] = checked(through(service, code, expected))
    unavailable = None
    if any(name in PEER_OF for name in chosen):
        try:
            ensure_venv(PEERS_VENV)
        except (OSError, subprocess.CalledProcessError) as exc:
            unavailable = f"could not install the peers into {PEERS_VENV.name}: {exc}"
    series: list[Series] = []
    for name in chosen:
        if name not in PEER_OF:
            series.append(Local(name, actions[name]))
            continue
        if unavailable:
            skipped[name] = unavailable
            continue
        peer = Peer(name, run_id, logs)
        stack.callback(peer.close)
        failure = peer.hello()
        if failure:
            skipped[name] = failure
        else:
            series.append(peer)
    for name, why in skipped.items():
        print(f"{name}: not run: {why}", flush=True)
    return series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pace-ms", type=float, default=500, help="paced mode: one run starts every this many ms")
    parser.add_argument("--modes", nargs="+", choices=["closed", "paced"], default=["closed", "paced"])
    parser.add_argument("--series", nargs="+", choices=list(TITLES), default=list(TITLES))
    parser.add_argument("--workers", type=int, default=2, help="execbox's workers")
    parser.add_argument("--pool", type=int, default=2, help="execbox's warm containers per worker")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    engine = docker.from_env(version="auto")
    try:
        image = engine.images.get(IMAGE)
    except ImageNotFound:
        raise SystemExit(f"{IMAGE} is missing: `make images` builds it") from None
    run_id, since = secrets.token_hex(4), int(time.time()) - 1
    skipped: dict[str, str] = {}  # not run at all
    dropped: dict[str, str] = {}  # stopped when every warm-up run of a program failed
    deployments: list[str] = []
    try:
        with ExitStack() as stack:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="execbox-peers-")))
            stack.callback(lambda: print(f"removed {sweep(engine, run_id, since, deployments)} containers left"))
            series = start_series(stack, args, run_id, logs, skipped, deployments)
            rows = {(s.name, m, p): Row() for s in series for m in args.modes for p in WORKLOADS}
            for mode in args.modes:
                for program in WORKLOADS:
                    print(f"{mode}: {PROGRAM_TITLES[program]}, {len(series)} series, {args.warmup} + {args.runs} "
                          "rounds", flush=True)  # fmt: skip
                    measure(series, program, mode, args, rows, dropped)
    except KeyboardInterrupt:
        print("interrupted: the peers' and execbox's containers are removed, execbox stopped", file=sys.stderr)
        return 130
    results: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "docker": engine.version().get("Version")},
        "args": {k: str(v) for k, v in vars(args).items()},
        "image": {"tag": IMAGE, "id": image.id},
        "series": {},
    }
    by_name = {s.name: s for s in series}
    for name in [n for n in TITLES if n in args.series]:
        pinned = VERSIONS.get(PEER_OF.get(name, ""))
        results["series"][name] = {
            "title": by_name[name].title if name in by_name else TITLES[name].format(version=pinned),
            "version": getattr(by_name.get(name), "version", None),
            "isolation": ISOLATION[name],
            "skipped": skipped.get(name),
            "dropped": dropped.get(name),
            "modes": {m: {p: rows[name, m, p].as_json() for p in WORKLOADS} for m in args.modes if name in by_name},
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(results, indent=2))
    report(results, args)
    print(f"\nfigures: {args.out / 'peers.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
