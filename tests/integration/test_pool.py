"""The warm pool against the real engine: used once, sized per run, refilled, recycled, cleaned up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from execbox.sandbox.runtime import POOL_LABEL, WORKER_LABEL
from execbox.worker.main import STOP_GRACE_S
from tests.conftest import ROOT, Side, run_code, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]

LIMITS_PROBE = """
import os
memory = open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()
quota = open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip()
print(memory, quota, os.environ['GREETING'])
"""


def idle(docker_client: docker.DockerClient, worker: str, pool_class: str = "python") -> set[str]:
    labels = [f"{WORKER_LABEL}={worker}", f"{POOL_LABEL}={pool_class}"]
    return {c["Id"] for c in docker_client.api.containers(filters={"label": labels})}


def full_pool(
    docker_client: docker.DockerClient,
    worker: str,
    size: int,
    previous: set[str] | None = None,
    pool_class: str = "python",
) -> set[str]:
    """Wait until the worker's pool holds `size` containers of the class, other than `previous` (a
    taken one is labelled like an idle one until its removal); their ids."""

    def ready() -> set[str] | None:
        ids = idle(docker_client, worker, pool_class)
        return ids if len(ids) == size and ids != previous else None

    found = wait_until(ready, 30, "the warm pool to fill")
    assert isinstance(found, set)
    return found


def gone(docker_client: docker.DockerClient, container_id: str) -> bool:
    return not docker_client.api.containers(all=True, filters={"id": container_id})


@pytest.fixture
def pooled(side_stack: Callable[..., Side]) -> Iterator[Callable[..., tuple[Side, str]]]:
    """Factory: a side API and one worker keeping `size` warm python containers; the worker is
    stopped (and so removes its pool) when the test ends."""
    workers: list[subprocess.Popen[bytes]] = []

    def make(size: int = 2, classes: list[dict[str, Any]] | None = None, **env: str) -> tuple[Side, str]:
        """`size` warm python containers of the default policy, or the given pool classes."""
        side = side_stack()
        name = f"{side.env['EXECBOX_QUEUE__NAME']}-pooled"
        pool = {"EXECBOX_POOL__CLASSES": json.dumps(classes)} if classes else {
            "EXECBOX_POOL__SIZES": json.dumps({"python": size})}  # fmt: skip
        workers.append(side.worker("pooled", **pool, **env))
        return side, name

    yield make
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def run(side: Side, code: str, env: dict[str, str] | None = None, **policy: Any) -> dict[str, Any]:
    with side.client() as client:
        return run_code(client, code, env=env, **policy)


def test_each_run_takes_a_fresh_warm_container_once(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=2)
    used: set[str] = set()
    before = full_pool(docker_client, worker, 2)
    for _ in range(3):
        assert not before & used, "a used container was offered again"
        body = run(side, "print(1)")
        assert body["status"] == "succeeded" and body["stdout"] == "1\n", body
        assert body["timing"]["warm_start"] is True
        after = full_pool(docker_client, worker, 2, before)
        (taken,) = before - after  # exactly one left the pool ...
        wait_until(lambda: gone(docker_client, taken), 20, "its removal")  # noqa: B023
        used.add(taken)  # ... and it no longer exists: never reused
        before = after


def test_run_gets_its_own_limits_env_and_outcome_on_a_warm_container(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=1)
    pool = full_pool(docker_client, worker, 1)
    body = run(side, LIMITS_PROBE, env={"GREETING": "hi"}, memory_mb=512, cpu=0.5)
    assert body["timing"]["warm_start"] is True and body["status"] == "succeeded", body
    assert body["stdout"].split() == [str(512 << 20), "50000", "hi"]

    pool = full_pool(docker_client, worker, 1, pool)
    oom = run(side, "blob = b'x' * (500 * 1024 * 1024)\nprint(len(blob))", memory_mb=320)
    assert oom["timing"]["warm_start"] is True
    assert oom["error"]["category"] == "limit.memory" and oom["resources"]["oom_killed"] is True, oom
    # Below the class's memory a warm container would have to give up its preloaded modules: cold.
    small = run(side, "print(3)", memory_mb=64)
    assert small["timing"]["warm_start"] is False and small["stdout"] == "3\n"

    pool = full_pool(docker_client, worker, 1, pool)
    failing = run(side, "import sys\nprint('out')\nsys.exit(7)")
    assert failing["timing"]["warm_start"] is True
    assert failing["exit_code"] == 7 and failing["error"]["category"] == "code.exit_nonzero", failing

    pool = full_pool(docker_client, worker, 1, pool)
    slow = run(side, "import time\ntime.sleep(30)", timeout_s=1)
    assert slow["timing"]["warm_start"] is True and slow["error"]["category"] == "limit.timeout", slow

    other_class = run(side, "print(2)", disk_mb=128)  # tmpfs sizes are fixed at creation: cold
    assert other_class["timing"]["warm_start"] is False and other_class["stdout"] == "2\n"


PRELOADED = "import sys\nprint(all(m in sys.modules for m in ('numpy', 'pandas')), flush=True)\n"


def preloaded(docker_client: docker.DockerClient, pool: set[str]) -> bool:
    """Whether the pool's container has its preloaded interpreter ready (its imports done)."""
    (cid,) = pool
    container = docker_client.containers.get(cid)
    uid = container.labels["execbox.uid"]
    return container.exec_run(["test", "-e", "/tmp/.execbox-preloaded"], user=uid).exit_code == 0


def ready_pool(
    docker_client: docker.DockerClient, worker: str, previous: set[str] | None = None, pool_class: str = "python"
) -> set[str]:
    pool = full_pool(docker_client, worker, 1, previous, pool_class)
    wait_until(lambda: preloaded(docker_client, pool), 30, "the preloaded interpreter to be ready")
    return pool


def test_a_warm_python_run_finds_its_modules_imported_and_keeps_every_limit(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=1)
    pool = ready_pool(docker_client, worker)
    probe = PRELOADED + (
        "import atexit, os, threading, time\n"
        "print(os.environ['GREETING'], os.getuid() >= 100000, os.getcwd())\n"
        "kept = open('out/kept.txt', 'w')\nkept.write('unflushed')\n"  # never closed: flushed at exit
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\n"
        "atexit.register(print, 'atexit')\n"
        "raise SystemExit(3)\n"
    )
    body = run(side, probe, env={"GREETING": "hi"})
    assert body["timing"]["warm_start"] is True and body["stdout"] == "True\nhi True /workspace\nthread\natexit\n"
    assert body["exit_code"] == 3 and body["error"]["category"] == "code.exit_nonzero", body
    with side.client() as client:
        (artifact,) = body["artifacts"]
        assert client.get(artifact["url"]).content == b"unflushed"

    # An environment that import-time behaviour depends on: a fresh interpreter, with that env.
    pool = ready_pool(docker_client, worker, pool)
    fresh = run(side, PRELOADED + "import os\nprint(os.environ['OMP_NUM_THREADS'])", env={"OMP_NUM_THREADS": "1"})
    assert fresh["timing"]["warm_start"] is True and fresh["stdout"] == "False\n1\n", fresh

    limited: dict[str, tuple[str, float]] = {
        "limit.memory": (PRELOADED + "blob = b'x' * (400 << 20)", 10),
        "limit.timeout": (PRELOADED + "import time\ntime.sleep(30)", 1),
        "limit.pids": (PRELOADED + "import threading, time\nfor _ in range(200):\n"
                       "    threading.Thread(target=time.sleep, args=(5,)).start()", 20),
    }  # fmt: skip
    for category, (code, timeout_s) in limited.items():
        pool = ready_pool(docker_client, worker, pool)
        ended = run(side, code, timeout_s=timeout_s)
        assert ended["timing"]["warm_start"] is True and ended["stdout"].startswith("True\n"), ended
        assert ended["error"]["category"] == category, ended


HEAVY_COSTS = {"start": 25, "numpy": 150, "pandas": 500, "scipy.stats": 2500, "sklearn.linear_model": 800}
"""A preload of ~3 s and 180 MiB (within the default policy's 256), generous costs in ms."""
HEAVY = tuple(name for name in HEAVY_COSTS if name != "start")


def heavy_preload(directory: Path) -> Path:
    """sandbox-images' metadata with a python preload of several seconds (under the pool's lowest
    CPU weight), so that a run can be sure to arrive while it imports."""
    for meta in (ROOT / "sandbox-images").glob("*/metadata.yaml"):
        folder = directory / meta.parent.name
        folder.mkdir(parents=True)
        for name in ("metadata.yaml", "versions.json"):
            if (meta.parent / name).exists():
                shutil.copy(meta.parent / name, folder / name)
    python = directory / "python" / "metadata.yaml"
    data = yaml.safe_load(python.read_text())
    data["preload"] = {"command": data["preload"]["command"], "modules": list(HEAVY),
                       "costs_ms": HEAVY_COSTS}  # fmt: skip
    python.write_text(yaml.safe_dump(data))
    return directory


@pytest.mark.serial
def test_a_run_arriving_mid_preload_waits_for_it_only_when_it_names_what_it_imports(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    side, worker = pooled(size=1, EXECBOX_IMAGES_DIR=str(heavy_preload(tmp_path / "images")))
    seen = f"import sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules), flush=True)\n"
    pool = full_pool(docker_client, worker, 1)
    assert not preloaded(docker_client, pool), "the preload ended before the run could arrive"
    waited = run(side, seen + "import sklearn.linear_model")  # names the last module: waiting is shorter
    assert waited["timing"]["warm_start"] is True and waited["stdout"] == f"{sorted(HEAVY)}\n", waited

    pool = full_pool(docker_client, worker, 1, pool)
    assert not preloaded(docker_client, pool), "the preload ended before the run could arrive"
    unnamed = "import sys\nprint(sorted(m for m in sys.modules if m in {'nump' + 'y', 'pand' + 'as'}))"
    fresh = run(side, unnamed)  # names none of them: a fresh interpreter at once, none imported
    assert fresh["timing"]["warm_start"] is True and fresh["stdout"] == "[]\n", fresh


PRELOADED_JS = "console.log(require.cache['/opt/execbox/preload.js'] !== undefined);\n"  # ran in the preloaded node


def test_a_warm_node_run_starts_in_the_preloaded_process_and_keeps_every_limit(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(classes=[{"language": "javascript", "min": 1, "max": 1}])

    def run_js(code: str, env: dict[str, str] | None = None, **policy: Any) -> dict[str, Any]:
        with side.client() as client:
            return run_code(client, code, "javascript", env=env, **policy)

    pool = ready_pool(docker_client, worker, pool_class="javascript")
    probe = PRELOADED_JS + (
        "const fs = require('fs');\n"
        "console.log(process.env.GREETING, process.getuid() >= 100000, process.cwd(), require.main === module);\n"
        "fs.writeFileSync('out/kept.txt', 'written');\n"
        "setTimeout(() => { console.log('timer'); process.exitCode = 3; }, 300);\n"
    )
    body = run_js(probe, env={"GREETING": "hi"})
    assert body["timing"]["warm_start"] is True and body["stdout"] == "true\nhi true /workspace true\ntimer\n", body
    assert body["exit_code"] == 3 and body["error"]["category"] == "code.exit_nonzero", body
    with side.client() as client:
        (artifact,) = body["artifacts"]
        assert client.get(artifact["url"]).content == b"written"

    # An option Node reads as it starts: a fresh node, with that option in force.
    pool = ready_pool(docker_client, worker, pool, "javascript")
    heap = "console.log(require('v8').getHeapStatistics().heap_size_limit < (100 << 20));"
    fresh = run_js(PRELOADED_JS + heap, env={"NODE_OPTIONS": "--max-old-space-size=64"})
    assert fresh["timing"]["warm_start"] is True and fresh["stdout"] == "false\ntrue\n", fresh

    limited = {
        "limit.memory": ("const kept = []; for (;;) kept.push(Buffer.alloc(1 << 20, 1));", 10),
        "limit.timeout": ("setTimeout(() => {}, 30000);", 1),
    }
    for category, (code, timeout_s) in limited.items():
        pool = ready_pool(docker_client, worker, pool, "javascript")
        ended = run_js(PRELOADED_JS + code, timeout_s=timeout_s)
        assert ended["timing"]["warm_start"] is True and ended["stdout"].startswith("true\n"), ended
        assert ended["error"]["category"] == category, ended


def test_program_cannot_read_the_launchers_memory(pooled: Callable[..., tuple[Side, str]]) -> None:
    side, _ = pooled(size=1)
    code = (
        "import os\n"
        "for path in ('/proc/1/mem', '/proc/1/environ'):\n"
        "    try:\n"
        "        open(path, 'rb').read(1); print(path, 'readable')\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
    )
    body = run(side, code)
    assert body["stdout"] == "/proc/1/mem PermissionError\n/proc/1/environ PermissionError\n", body


def test_stale_containers_are_recycled_and_a_stopped_worker_leaves_none(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=2, EXECBOX_POOL__MAX_IDLE_S="2")
    first = full_pool(docker_client, worker, 2)
    wait_until(lambda: len(idle(docker_client, worker) - first) == 2, 30, "both to be replaced")
    assert not idle(docker_client, worker) & first
    (proc,) = [p for p in side.processes.procs if p.args[-1] == worker]  # type: ignore[index]
    proc.send_signal(signal.SIGTERM)  # a clean stop: the worker removes its own pool
    proc.wait(30)
    assert not idle(docker_client, worker)
    labelled = docker_client.api.containers(all=True, filters={"label": f"{WORKER_LABEL}={worker}"})
    assert not labelled


@pytest.mark.serial
def test_a_worker_stopped_while_its_pool_fills_exits_within_its_grace(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    """Issue 44: a pooled worker still ran 30 s after SIGTERM. Stopped with creations in flight, it is
    gone within its stop grace (what it was still making carries its name: the reaper's, as above)."""
    side, worker = pooled(size=6)
    made = {"label": [f"{WORKER_LABEL}={worker}"]}  # created (not yet started) ones count: the pool fills
    wait_until(lambda: docker_client.api.containers(all=True, filters=made), 60, "the pool to start filling")
    (proc,) = [p for p in side.processes.procs if p.args[-1] == worker]  # type: ignore[index]
    proc.send_signal(signal.SIGTERM)
    proc.wait(STOP_GRACE_S + 5)  # its clean-up's grace, and RQ's own teardown (a few Redis calls)


def test_a_killed_workers_pool_is_reaped(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=2)
    full_pool(docker_client, worker, 2)
    (proc,) = [p for p in side.processes.procs if p.args[-1] == worker]  # type: ignore[index]
    proc.kill()
    proc.wait(10)
    # The session's workers (same deployment) remove them once the dead worker's heartbeat is gone.
    wait_until(lambda: not idle(docker_client, worker), 60, "the dead worker's pool to be reaped")


def test_runs_leave_no_thread_behind(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(size=1)
    (proc,) = [p for p in side.processes.procs if p.args[-1] == worker]  # type: ignore[index]

    def threads() -> int:
        return len(os.listdir(f"/proc/{proc.pid}/task"))

    pool = full_pool(docker_client, worker, 1)
    run(side, "print(1)")  # the first run starts the threads a worker keeps (clients, timers)
    pool = full_pool(docker_client, worker, 1, pool)
    before = threads()
    for _ in range(12):
        assert run(side, "print(1)")["stdout"] == "1\n"
    full_pool(docker_client, worker, 1, pool)
    wait_until(lambda: threads() <= before + 2, 10, "the runs' threads to end")  # a reader per run once leaked


def test_named_policies_and_variants_have_warm_classes_of_their_own(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(classes=[{"language": "python@slim", "min": 1, "max": 1},
                                   {"language": "python", "policy": "large", "min": 1, "max": 1}])  # fmt: skip
    full_pool(docker_client, worker, 1, pool_class="python@slim")
    full_pool(docker_client, worker, 1, pool_class="python:large")
    with side.client() as client:
        slim = run_code(client, "import importlib.util as u; print(u.find_spec('pandas') is None)", "python@slim")
        large = run_code(client, "print(2)", name="large")
        default = run_code(client, "print(3)")
    assert slim["timing"]["warm_start"] is True and slim["stdout"] == "True\n", slim  # the slim image's
    assert large["timing"]["warm_start"] is True and large["stdout"] == "2\n", large
    assert default["timing"]["warm_start"] is False, "no class holds the default policy's containers"


def submit_burst(side: Side, n: int) -> list[dict[str, Any]]:
    """n executions submitted at once (queued behind one another on the one worker), then their results."""
    with side.client() as client:
        ids = []
        for i in range(n):
            response = client.post("/v1/executions", json={"language": "python", "code": f"print({i})"})
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
        return [client.get(f"/v1/executions/{i}?wait=60").json() for i in ids]


@pytest.mark.serial
def test_the_pool_grows_for_a_burst_within_its_max_and_shrinks_when_arrivals_stop(
    pooled: Callable[..., tuple[Side, str]], docker_client: docker.DockerClient
) -> None:
    side, worker = pooled(classes=[{"language": "python", "min": 1, "max": 3}], EXECBOX_POOL__WINDOW_S="15",
                          EXECBOX_POOL__PRELOAD="false")  # fmt: skip
    full_pool(docker_client, worker, 1)
    first = submit_burst(side, 5)
    assert [b["status"] for b in first] == ["succeeded"] * 5
    assert first[0]["timing"]["warm_start"] is True  # the one that waited; refills between runs may serve others
    full_pool(docker_client, worker, 3)  # five arrived at once: as many as the max wait now
    second = submit_burst(side, 3)
    assert [b["timing"]["warm_start"] for b in second] == [True, True, True], second
    # Once the bursts leave the 15 s window the class falls back to its min.
    wait_until(lambda: len(idle(docker_client, worker)) == 1, 60, "the pool to shrink to its min")
