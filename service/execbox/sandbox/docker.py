"""DockerRuntime: the only module that imports docker. One hardened container per run.

The code never travels in a shell string. The container's command is a fixed argv: the image's
launcher (PID 1) followed by the language's command. The request's input files are copied into
/workspace through the engine's archive API; the code and other small service files arrive on
stdin in a frame the launcher unpacks before it starts the program. /workspace is a size-capped
tmpfs volume, so it stays readable through the engine (get_archive) until the container is
removed: the launcher holds the container open after the program ends until the worker has
collected the output directory and releases it with SIGUSR1.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DriverConfig, Mount, Ulimit
from docker.utils.socket import frames_iter

from execbox.errors import ImageUnavailable, RuntimeUnavailable
from execbox.sandbox.base import (
    DEPLOYMENT_LABEL,
    EXECUTION_LABEL,
    MANAGED_LABEL,
    SANDBOX_UID,
    TRACE_LABEL,
    WORKDIR,
    WORKER_LABEL,
    ContainerInfo,
    RunControl,
    RunOutcome,
    RunSpec,
)
from execbox.settings import DockerSettings

log = logging.getLogger(__name__)

SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
LAUNCHER = ("python3", "-I", "-S", "/opt/execbox/launch.py")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
STDOUT, STDERR = 1, 2
RELEASE_SIGNAL = "SIGUSR1"


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


def frame_files(files: tuple[tuple[str, bytes], ...], nonce: str = "") -> bytes:
    """The launcher's stdin frame: header length, header lines, then the files' bytes."""
    lines = ([f"nonce {nonce}\n"] if nonce else []) + [f"{len(data)} 644 {path}\n" for path, data in files]
    encoded = "".join(lines).encode()
    return b"%010d" % len(encoded) + encoded + b"".join(data for _, data in files)


def done_marker(nonce: str) -> bytes:
    """The launcher's end-of-run marker without its last two bytes: b"0"/b"1" (out/ empty or not), NUL."""
    return b"\n\x00execbox-done:%s:" % nonce.encode()


def host_config_kwargs(spec: RunSpec, runtime: str | None) -> dict[str, Any]:
    """Every protection of DESIGN.md's 'Every sandbox, always', as engine settings."""
    lim = spec.limits
    workspace = DriverConfig(
        "local",
        {"type": "tmpfs", "device": "tmpfs", "o": f"size={lim.disk_mb}m,uid={SANDBOX_UID},gid={SANDBOX_UID},"
         "mode=0755,nosuid,nodev"},
    )  # fmt: skip
    kwargs: dict[str, Any] = {
        "network_mode": "none",
        "read_only": True,
        "mounts": [Mount(target=WORKDIR, source=None, type="volume", driver_config=workspace)],
        "tmpfs": {"/tmp": f"size={lim.disk_mb}m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=1777,nosuid,nodev,noexec"},
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
        "ipc_mode": "private",
        "privileged": False,
        "log_config": {"type": "none", "config": {}},
    }
    if runtime:
        kwargs["runtime"] = runtime
    return kwargs


class _Capture:
    """Reads the multiplexed attach stream in its own thread: byte caps per stream, and the
    launcher's end-of-run marker at the end of stderr."""

    def __init__(self, cap: int, marker: bytes, wake: threading.Event) -> None:
        self.cap = cap
        self.marker = marker
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.total = {STDOUT: 0, STDERR: 0}
        self.overflowed = False
        self.done = False
        self.produced = True
        self.eof = False
        self._tail = b""
        self._wake = wake

    def pump(self, sock: Any) -> None:
        try:
            for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
                if stream in self.kept:
                    self._take(stream, data)
        except OSError:
            pass  # the container went away; what was read is kept
        self.eof = True
        self._wake.set()

    def _take(self, stream: int, data: bytes) -> None:
        self.total[stream] += len(data)
        room = self.cap + len(self.marker) + 2 - len(self.kept[stream])
        self.kept[stream] += data[: max(room, 0)]
        if stream == STDERR and not self.done:
            size = len(self.marker) + 2
            self._tail = (self._tail + data)[-size:]
            if self._tail[:-2] == self.marker and self._tail[-1:] == b"\x00" and self._tail[-2:-1] in (b"0", b"1"):
                self.done = True
                self.produced = self._tail[-2:-1] == b"1"
                self.total[STDERR] -= size
                if self.kept[STDERR].endswith(self._tail):
                    del self.kept[STDERR][-size:]
                self._wake.set()
                return
        # The marker may still follow, so a stream is over its cap only past cap + marker.
        if self.total[stream] > self.cap + len(self.marker) + 2 and not self.overflowed:
            self.overflowed = True
            self._wake.set()

    def result(self, stream: int) -> tuple[bytes, int, bool]:
        total = self.total[stream]
        return bytes(self.kept[stream][: self.cap]), total, total > self.cap


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
                # Off the result's path: removal (with its volume) takes ~50 ms. If this process
                # dies first, the reaper finds the container by its label.
                threading.Thread(target=self.remove, args=(container_id,), daemon=True).start()

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
                DEPLOYMENT_LABEL: spec.deployment,
                EXECUTION_LABEL: spec.execution_id,
                TRACE_LABEL: spec.trace_id,
                WORKER_LABEL: spec.worker,
            },
            host_config=host_config,
        )
        return str(created["Id"])

    def _run_created(self, spec: RunSpec, control: RunControl, cid: str, image_id: str, t0: float) -> RunOutcome:
        api = self.api
        nonce = secrets.token_hex(8)
        wake = threading.Event()
        capture = _Capture(spec.limits.output_bytes, done_marker(nonce), wake)
        sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        reader = threading.Thread(target=capture.pump, args=(sock,), name=f"capture-{spec.execution_id}", daemon=True)
        reader.start()
        api.start(cid)
        if spec.input_archive:
            api.put_archive(cid, WORKDIR, spec.input_archive)
        started = time.monotonic()
        control.set_killer(wake.set)
        payload = frame_files(spec.files, nonce) + spec.stdin
        threading.Thread(target=_feed, args=(raw, payload), daemon=True).start()
        # Not joined: the stats stream ends by itself when the container is removed, and a run
        # shorter than the engine's first sample simply reports no peak.
        peak: list[int] = []
        threading.Thread(target=self._sample_memory, args=(cid, peak), daemon=True).start()

        wake.wait(timeout=spec.limits.timeout_s)
        ended = time.monotonic()
        timed_out = not wake.is_set()
        finished = capture.done and not (timed_out or capture.overflowed or control.cancelled)
        collect_error: str | None = None
        if finished:
            # The launcher says whether out/ is empty; a program can only lie about its own files.
            if capture.produced or spec.collect_path != "out":
                collect_error = self._collect(cid, spec)
            self._signal(cid, RELEASE_SIGNAL)
        elif not capture.eof:
            # Stopped from outside (timeout, output cap, cancel): freeze every process so the
            # collection sees a still workspace, then kill.
            collect_error = self._collect(cid, spec, freeze=True)
            self._signal(cid, "SIGKILL")
        else:
            collect_error = "the sandbox ended before its output directory could be collected"
        collected_at = time.monotonic()
        exit_code = self._wait(cid, 10.0)
        reader.join(timeout=5.0)
        state = api.inspect_container(cid)["State"]
        _close(sock)
        stdout, stdout_total, stdout_over = capture.result(STDOUT)
        stderr, stderr_total, stderr_over = capture.result(STDERR)
        return RunOutcome(
            exit_code=exit_code if exit_code is not None else state.get("ExitCode"),
            stdout=stdout,
            stderr=stderr,
            stdout_total=stdout_total,
            stderr_total=stderr_total,
            stdout_truncated=stdout_over,
            stderr_truncated=stderr_over,
            timed_out=timed_out,
            cancelled=control.cancelled,
            oom_killed=bool(state.get("OOMKilled")),
            peak_memory_bytes=max(peak) if peak else None,
            image_id=image_id,
            start_ms=(started - t0) * 1000,
            run_ms=(ended - started) * 1000,
            collect_ms=(collected_at - ended) * 1000,
            collect_error=collect_error if spec.collector else None,
        )

    def _collect(self, cid: str, spec: RunSpec, freeze: bool = False) -> str | None:
        if spec.collector is None:
            return None
        api = self.api
        try:
            if freeze:
                api.pause(cid)
            path = f"{WORKDIR}/{spec.collect_path}".rstrip("/")
            try:
                stream, _ = api.get_archive(cid, path, chunk_size=1 << 16)
            except NotFound:
                return None  # the program made no output directory: nothing to collect
            spec.collector(stream)
            return None
        except (DockerException, requests.RequestException) as exc:
            log.warning("could not collect the output directory: %s", exc)
            return f"the output directory could not be read from the sandbox ({exc})"
        finally:
            if freeze:
                try:
                    api.unpause(cid)
                except (DockerException, requests.RequestException):
                    pass  # killed next anyway

    def _wait(self, cid: str, timeout_s: float) -> int | None:
        """The exit code, or None when the container still runs after timeout_s."""
        try:
            result = self.api.wait(cid, timeout=cast(int, max(timeout_s, 0.001)))  # requests takes float seconds
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None
        return int(result["StatusCode"])

    def _signal(self, cid: str, signal: str) -> None:
        try:
            self.api.kill(cid, signal=signal)
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

    def managed_containers(self, deployment: str) -> list[ContainerInfo]:
        labels = [f"{MANAGED_LABEL}=true", f"{DEPLOYMENT_LABEL}={deployment}"]
        with _docker_errors():
            found = self.api.containers(all=True, filters={"label": labels})
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
