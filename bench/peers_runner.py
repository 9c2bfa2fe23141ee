"""The peers' half of bench/peers.py: one series of one peer, in .venv-peers (not the project's
.venv), kept running for the whole bench so that bench/peers.py can interleave it with its own
series. It speaks lines on stdin/stdout:

  hello           -> ok <json: the peer's name and version>
  run <program>   -> ok <elapsed ms>  |  error <why>
  quit (or EOF)   -> removes what the series holds (llm-sandbox's pool) and exits

It also holds the peers' pinned versions and makes their environment (ensure_venv).

The elapsed time is taken here, around the peer's own call, from before it creates or takes a
container to after it has removed or released it. The peers' log lines go to stderr.

Series (each on the image given by --image, --label on every container the peer lets us label):
  llm-fresh   llm-sandbox, a new session (a new container) per run, closed at the end of the run
  llm-pooled  llm-sandbox's container pool: a pooled session per run on one pooled container
  epicbox     epicbox.run: a new container per run, removed at its end

What the image needs from us: it has no command of its own, and llm-sandbox's containers must stay
up between its `docker exec`s, so they run `sleep infinity` under Docker's init (without an init
the stop at close waits out Docker's 10 s grace: PID 1 ignores SIGTERM). llm-sandbox's sessions
skip its environment set-up (a venv per container and `pip install --upgrade pip` from the
network): the image already holds the packages. A pooled session runs code with the venv's
python (<workdir>/.sandbox-venv/bin/python); the pool's containers link that path to the image's
own environment (/opt/python) when they start.

What each peer isolates (bench/peers.py's ISOLATION), read in .venv-peers/lib/python3.*/site-packages:
  llm_sandbox/docker.py:383-395   a container is created as root (tty) with runtime_configs and
                                  nothing else: Docker's default network, capabilities and seccomp,
                                  writable root, no memory, CPU or pids limits
  llm_sandbox/pool/base.py:278-307  release() hands the container back to the pool as it is; it is
                                  replaced only past max_container_lifetime (1 h), max_container_uses
                                  (none by default, pool/config.py:69) or a failed health check
  llm_sandbox/core/session_base.py:499-503  each run's code is copied into the workdir under a new
                                  name and never removed: the next run on a pooled container finds it
  llm_sandbox/core/session_base.py:513  a pooled (existing) container's code runs with the venv's python
  epicbox/config.py:20-37         defaults: 64 MiB, 1 s of CPU, processes -1 (no limit), user root;
                                  profiles: writable root, network disabled
  epicbox/sandboxes.py:114-131    the container: memory and swap limit, RLIMIT_CPU, pids limit, no
                                  log driver; nothing about capabilities or seccomp
  epicbox/sandboxes.py:204        removed (with its volumes) at the end of each run
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# urllib3 below 2: epicbox 1.1.0 builds its Docker client's retries with `method_whitelist`, which
# urllib3 2 removed.
VERSIONS = {"llm-sandbox": "0.3.46", "epicbox": "1.1.0"}
PEERS = (f"llm-sandbox[docker]=={VERSIONS['llm-sandbox']}", f"epicbox=={VERSIONS['epicbox']}", "urllib3<2")
VENV_LINK = "mkdir -p /sandbox && ln -sfn /opt/python /sandbox/.sandbox-venv && exec sleep infinity"


def ensure_venv(venv: Path) -> None:
    """The peers' environment (bench/peers.py calls this from the project's .venv): made with
    `python3 -m venv`, PEERS installed from PyPI; again when PEERS changed."""
    stamp = venv / "execbox-peers.txt"
    wanted = "\n".join(PEERS) + "\n"
    python = venv / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return
    print(f"peers: installing {', '.join(PEERS)} into {venv}", flush=True)
    if not python.exists():
        subprocess.run([shutil.which("python3") or "python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEERS], check=True)
    stamp.write_text(wanted)


class Series:
    peer = ""

    def __init__(self, image: str, labels: dict[str, str]) -> None:
        self.image = image
        self.labels = labels

    def run(self, code: str) -> str:
        """Runs `code`, answers its stdout; raises when the run failed."""
        raise NotImplementedError

    def close(self) -> None:
        return None


class LlmFresh(Series):
    peer = "llm-sandbox"

    def __init__(self, image: str, labels: dict[str, str]) -> None:
        super().__init__(image, labels)
        self.llm: Any = importlib.import_module("llm_sandbox")

    def runtime(self, command: list[str]) -> dict[str, Any]:
        return {"command": command, "init": True, "labels": dict(self.labels)}

    def run(self, code: str) -> str:
        with self.llm.SandboxSession(
            lang="python",
            image=self.image,
            runtime_configs=self.runtime(["sleep", "infinity"]),
            skip_environment_setup=True,
            keep_template=True,
        ) as session:
            return checked(session.run(code))


class LlmPooled(LlmFresh):
    def __init__(self, image: str, labels: dict[str, str]) -> None:
        super().__init__(image, labels)
        pool_module: Any = importlib.import_module("llm_sandbox.pool")
        # One client: one container is all the pool needs; the other settings are the library's.
        self.pool = pool_module.create_pool_manager(
            backend="docker",
            config=pool_module.PoolConfig(min_pool_size=1, max_pool_size=1),
            lang="python",
            image=self.image,
            runtime_configs=self.runtime(["sh", "-c", VENV_LINK]),
            skip_environment_setup=True,
        )

    def run(self, code: str) -> str:
        with self.llm.SandboxSession(pool=self.pool, lang="python") as session:
            return checked(session.run(code))

    def close(self) -> None:
        self.pool.close()


def checked(result: Any) -> str:
    if result.exit_code:
        raise RuntimeError(f"exit code {result.exit_code}: {(result.stderr or result.stdout)[-300:]}")
    return str(result.stdout)


class Epicbox(Series):
    peer = "epicbox"
    # Memory and CPU time as in execbox's default policy (policies/default.yaml), in place of
    # epicbox's own defaults (64 MiB, 1 s of CPU). Processes stay at epicbox's default: no limit.
    LIMITS = {"cputime": 20, "realtime": 30, "memory": 256}

    def __init__(self, image: str, labels: dict[str, str]) -> None:
        super().__init__(image, labels)
        self.epicbox: Any = importlib.import_module("epicbox")
        profile = self.epicbox.Profile("python", image)  # its defaults: root, network disabled
        self.epicbox.configure(profiles=[profile], docker_url=os.environ.get("DOCKER_HOST"))

    def run(self, code: str) -> str:
        files = [{"name": "main.py", "content": code.encode()}]
        result = self.epicbox.run("python", "python3 main.py", files=files, limits=dict(self.LIMITS))
        if result["exit_code"] != 0 or result["timeout"] or result["oom_killed"]:
            status = {k: result[k] for k in ("exit_code", "timeout", "oom_killed")}
            raise RuntimeError(f"{status}: {result['stderr'].decode(errors='replace')[-300:]}")
        return str(result["stdout"].decode())


class Broken(Series):
    """A series whose peer could not be set up: every run answers why."""

    def __init__(self, peer: str, failure: Exception) -> None:
        super().__init__("", {})
        self.peer = peer
        self.failure = failure

    def run(self, code: str) -> str:
        raise RuntimeError(f"set-up failed: {type(self.failure).__name__}: {self.failure}")


SERIES: dict[str, type[Series]] = {"llm-fresh": LlmFresh, "llm-pooled": LlmPooled, "epicbox": Epicbox}


def one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def serve(series: Series, programs: dict[str, list[str]], reply: Any) -> None:
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "quit":
            return
        if command == "hello":
            try:
                reply(f"ok {json.dumps({'peer': series.peer, 'version': version(series.peer)})}")
            except PackageNotFoundError as exc:
                reply(f"error {series.peer} is not installed: {exc}")
        elif command == "run" and argument in programs:
            code, expected = programs[argument]
            start = time.perf_counter()
            try:
                stdout = series.run(code)
            except Exception as exc:  # a peer's failure is a figure of the bench, not its end
                reply(f"error {one_line(f'{type(exc).__name__}: {exc}')}")
                continue
            elapsed = (time.perf_counter() - start) * 1000
            reply(f"ok {elapsed:.3f}" if stdout == expected else f"error wrong output {stdout[-200:]!r}")
        else:
            reply(f"error unknown command {one_line(line)!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", choices=sorted(SERIES), required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--label", action="append", default=[], help="key=value, on every container")
    parser.add_argument("--programs", required=True, help='JSON: {"name": [code, expected stdout]}')
    args = parser.parse_args()
    # The protocol keeps the real stdout; whatever the peers print goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(text: str) -> None:
        protocol.write(text + "\n")

    labels = dict(item.split("=", 1) for item in args.label)
    kind = SERIES[args.series]
    series: Series
    try:
        series = kind(args.image, labels)
    except Exception as exc:  # answered at each run, so that the bench prints why
        series = Broken(kind.peer, exc)
    try:
        serve(series, json.loads(args.programs), reply)
    except KeyboardInterrupt:
        pass
    finally:
        series.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
