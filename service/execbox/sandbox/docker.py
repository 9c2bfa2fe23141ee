"""DockerRuntime: the only module that imports docker. One hardened container per run.

The code never travels in a shell string: the container's command is a fixed argv (the image's
launcher followed by the language's command), and the program's files arrive on stdin in a
framed stream that the launcher unpacks into /workspace before it execs the program.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Ulimit
from docker.utils.socket import frames_iter

from execbox.errors import ImageUnavailable, RuntimeUnavailable
from execbox.sandbox.base import (
    EXECUTION_LABEL,
    MANAGED_LABEL,
    TRACE_LABEL,
    WORKER_LABEL,
    ContainerInfo,
    RunControl,
    RunOutcome,
    RunSpec,
)
from execbox.settings import DockerSettings

log = logging.getLogger(__name__)

SANDBOX_USER = "65534:65534"
WORKDIR = "/workspace"
LAUNCHER = ("python3", "-I", "-S", "/opt/execbox/launch.py")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
STDOUT, STDERR = 1, 2


@contextmanager
def _docker_errors() -> Iterator[None]:
    try:
        yield
    except ImageNotFound as exc:
        raise ImageUnavailable(
            f"sandbox image missing on this worker's engine ({exc.explanation}); build it with `make images`"
        ) from exc
    except (DockerException, requests.RequestException) as exc:
        raise RuntimeUnavailable(f"Docker engine unreachable or failing ({exc}); retry shortly") from exc


def frame_files(files: tuple[tuple[str, bytes], ...]) -> bytes:
    """The launcher's stdin frame: header length, JSON header, then the files' bytes."""
    encoded = "".join(f"{len(data)} 644 {path}\n" for path, data in files).encode()
    return b"%010d" % len(encoded) + encoded + b"".join(data for _, data in files)


def host_config_kwargs(spec: RunSpec, runtime: str | None) -> dict[str, Any]:
    """Every protection of DESIGN.md's 'Every sandbox, always', as engine settings."""
    lim = spec.limits
    disk = f"size={lim.disk_mb}m"
    kwargs: dict[str, Any] = {
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {
            WORKDIR: f"{disk},uid=65534,gid=65534,mode=0755,nosuid,nodev",
            "/tmp": f"{disk},uid=65534,gid=65534,mode=1777,nosuid,nodev,noexec",
        },
        "shm_size": f"{min(lim.disk_mb, 64)}m",
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        "pids_limit": lim.pids,
        "nano_cpus": int(lim.cpu * 1e9),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ulimits": [
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="fsize", soft=lim.disk_mb << 20, hard=lim.disk_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="stack", soft=8 << 20, hard=8 << 20),
            Ulimit(name="cpu", soft=lim.cpu_time_s, hard=lim.cpu_time_s + 1),
        ],
        "init": True,
        "ipc_mode": "private",
        "privileged": False,
        "log_config": {"type": "none", "config": {}},
    }
    if runtime:
        kwargs["runtime"] = runtime
    return kwargs


class _Capture:
    """Reads the multiplexed attach stream with a byte cap per stream, in its own thread."""

    def __init__(self, cap: int, on_overflow: Any) -> None:
        self.cap = cap
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.total = {STDOUT: 0, STDERR: 0}
        self.overflowed: set[int] = set()
        self._on_overflow = on_overflow

    def pump(self, sock: Any) -> None:
        try:
            for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
                if stream not in self.kept:
                    continue
                self.total[stream] += len(data)
                room = self.cap - len(self.kept[stream])
                self.kept[stream] += data[: max(room, 0)]
                if self.total[stream] > self.cap and stream not in self.overflowed:
                    self.overflowed.add(stream)
                    self._on_overflow()
        except OSError:
            pass  # the container went away; what was read is kept


class DockerRuntime:
    def __init__(self, settings: DockerSettings) -> None:
        self._settings = settings
        self._client: docker.DockerClient | None = None
        self._image_ids: dict[str, str] = {}

    @property
    def api(self) -> docker.APIClient:
        if self._client is None:
            with _docker_errors():
                timeout = int(self._settings.api_timeout_s)
                self._client = (
                    docker.DockerClient(base_url=self._settings.url, timeout=timeout, version="auto")
                    if self._settings.url
                    else docker.from_env(timeout=timeout, version="auto")
                )
        return self._client.api

    def ping(self) -> None:
        with _docker_errors():
            self.api.ping()

    def image_id(self, image: str) -> str:
        if image not in self._image_ids:
            with _docker_errors():
                self._image_ids[image] = str(self.api.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
        return self._image_ids[image]

    def run(self, spec: RunSpec, control: RunControl) -> RunOutcome:
        t0 = time.monotonic()
        try:
            image_id = self.image_id(spec.image)
        except ImageUnavailable:
            self._image_ids.pop(spec.image, None)
            raise
        container_id: str | None = None
        try:
            with _docker_errors():
                container_id = self._create(spec)
                return self._run_created(spec, control, container_id, image_id, t0)
        finally:
            if container_id is not None:
                self.remove(container_id)

    def _create(self, spec: RunSpec) -> str:
        api = self.api
        host_config = api.create_host_config(**host_config_kwargs(spec, self._settings.runtime))
        created = api.create_container(
            spec.image,
            command=[*LAUNCHER, *spec.command],
            user=SANDBOX_USER,
            working_dir=WORKDIR,
            environment={**BASE_ENV, **dict(spec.env)},
            stdin_open=True,
            tty=False,
            hostname="sandbox",
            network_disabled=True,
            labels={
                MANAGED_LABEL: "true",
                EXECUTION_LABEL: spec.execution_id,
                TRACE_LABEL: spec.trace_id,
                WORKER_LABEL: spec.worker,
            },
            host_config=host_config,
        )
        return str(created["Id"])

    def _run_created(self, spec: RunSpec, control: RunControl, cid: str, image_id: str, t0: float) -> RunOutcome:
        api = self.api
        killed_for: set[str] = set()

        def kill(reason: str) -> None:
            killed_for.add(reason)
            self._kill(cid)

        # The reader must never block on the kill: the engine only finishes stopping a container
        # once its output is drained, which is the reader's job.
        capture = _Capture(
            spec.limits.output_bytes,
            lambda: threading.Thread(target=kill, args=("output",), daemon=True).start(),
        )
        sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        reader = threading.Thread(target=capture.pump, args=(sock,), name=f"capture-{spec.execution_id}", daemon=True)
        reader.start()
        api.start(cid)
        started = time.monotonic()
        control.set_killer(lambda: kill("cancel"))
        feeder = threading.Thread(target=_feed, args=(raw, frame_files(spec.files)), daemon=True)
        feeder.start()
        # Not joined: the stats stream ends by itself when the container is removed, and a run
        # shorter than the engine's first sample simply reports no peak.
        peak: list[int] = []
        threading.Thread(target=self._sample_memory, args=(cid, peak), daemon=True).start()

        exit_code = self._wait(cid, spec.limits.timeout_s - (time.monotonic() - started))
        if exit_code is None:
            kill("timeout")
            exit_code = self._wait(cid, 10.0)
        ended = time.monotonic()
        reader.join(timeout=5.0)
        state = api.inspect_container(cid)["State"]
        _close(sock)
        return RunOutcome(
            exit_code=exit_code if exit_code is not None else state.get("ExitCode"),
            stdout=bytes(capture.kept[STDOUT]),
            stderr=bytes(capture.kept[STDERR]),
            stdout_total=capture.total[STDOUT],
            stderr_total=capture.total[STDERR],
            stdout_truncated=STDOUT in capture.overflowed,
            stderr_truncated=STDERR in capture.overflowed,
            timed_out="timeout" in killed_for,
            cancelled="cancel" in killed_for,
            oom_killed=bool(state.get("OOMKilled")),
            peak_memory_bytes=max(peak) if peak else None,
            image_id=image_id,
            start_ms=(started - t0) * 1000,
            run_ms=(ended - started) * 1000,
        )

    def _wait(self, cid: str, timeout_s: float) -> int | None:
        """The exit code, or None when the program is still running after timeout_s."""
        if timeout_s <= 0:
            return None
        try:
            result = self.api.wait(cid, timeout=cast(int, max(timeout_s, 0.001)))  # requests takes float seconds
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None
        return int(result["StatusCode"])

    def _kill(self, cid: str) -> None:
        try:
            self.api.kill(cid)
        except (NotFound, APIError):
            pass  # already stopped

    def _sample_memory(self, cid: str, peak: list[int]) -> None:
        # cgroup v1 reports max_usage (the high-water mark); v2 only the current usage.
        try:
            for stats in self.api.stats(cid, decode=True, stream=True):
                memory = stats.get("memory_stats") or {}
                value = memory.get("max_usage") or memory.get("usage")
                if value:
                    peak.append(int(value))
        except (DockerException, requests.RequestException, ValueError):
            pass

    def remove(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except NotFound:
            pass
        except (DockerException, requests.RequestException) as exc:
            # The reaper finds it later by its label; the run's outcome is unaffected.
            log.warning("could not remove container %s: %s", container_id[:12], exc)

    def managed_containers(self) -> list[ContainerInfo]:
        with _docker_errors():
            found = self.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
        return [
            ContainerInfo(
                id=c["Id"],
                execution_id=(c.get("Labels") or {}).get(EXECUTION_LABEL),
                created_at=float(c.get("Created", 0)),
                running=c.get("State") == "running",
            )
            for c in found
        ]


def _feed(raw: socket.socket, data: bytes) -> None:
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the program ended (or was killed) before reading everything


def _close(sock: Any) -> None:
    try:
        sock.close()
    except OSError:
        pass
