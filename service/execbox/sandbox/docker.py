"""DockerRuntime: the only module that imports docker. One hardened container per run.

The code never travels in a shell string. The container's command is a fixed argv: the image's
launcher (PID 1) followed by the language's command. The request's input files are copied into
/workspace through the engine's archive API; the code and other small service files arrive on
stdin in a frame the launcher unpacks before it starts the program. /workspace is a size-capped
tmpfs volume, so it stays readable through the engine (get_archive) until the container is
removed: the launcher holds the container open after the program ends until the worker has
collected the output directory, and the container is then removed.

A container comes from the warm pool (created and started with the same hardening before the
request arrived, waiting on stdin; used once) when the worker keeps one for the run's class, and
is created on the spot otherwise. The per-request environment travels in the stdin frame for both.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DriverConfig, IPAMConfig, IPAMPool, Mount, Ulimit
from docker.utils.socket import frames_iter

from execbox.core.errors import ImageUnavailable, RuntimeUnavailable
from execbox.core.settings import DockerSettings
from execbox.sandbox.pool import WarmPool
from execbox.sandbox.runtime import (
    DEPLOYMENT_LABEL,
    EXECUTION_LABEL,
    MANAGED_LABEL,
    POOL_LABEL,
    TRACE_LABEL,
    UID_LABEL,
    WORKDIR,
    WORKER_LABEL,
    ContainerInfo,
    EgressSpec,
    Limits,
    RunControl,
    RunOutcome,
    RunSpec,
)
from execbox.sandbox.seccomp import SeccompProfiles
from execbox.sandbox.uids import LocalUids, UidAllocator

log = logging.getLogger(__name__)
DEFAULT_POLICIES = Path(__file__).resolve().parents[3] / "policies"

# Docker's own masked paths (20.10) and the ones its later releases and CIS guidance add: kernel
# state a sandbox has no use for (interrupt counts leak other tenants' activity, powercap leaks
# energy counters usable as a side channel).
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/proc/interrupts",
    "/proc/softirqs", "/sys/devices/virtual/powercap", "/sys/devices/system/cpu/cpu0/thermal_throttle",
)  # fmt: skip
# An execute-only copy of python3 (sandbox-images/common/harden.sh): see launch.py on why. gVisor
# cannot load an unreadable binary; there the launcher relies on prctl(PR_SET_DUMPABLE, 0) alone.
LAUNCHER = ("/usr/bin/python3-launcher", "-I", "-S", "/opt/execbox/launch.py")
GVISOR_LAUNCHER = ("/usr/bin/python3", "-I", "-S", "/opt/execbox/launch.py")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
STDOUT, STDERR = 1, 2
CPU_PERIOD_US = 100_000
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


def frame_files(files: tuple[tuple[str, bytes], ...], nonce: str = "", env: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The launcher's stdin frame: header length, header lines, then the environment and files."""
    environ = b"".join(f"{name}={value}".encode() + b"\0" for name, value in env)
    lines = [f"nonce {nonce}\n"] if nonce else []
    lines += [f"environ {len(environ)}\n"] if environ else []
    lines += [f"{len(data)} 644 {path}\n" for path, data in files]
    encoded = "".join(lines).encode()
    return b"%010d" % len(encoded) + encoded + environ + b"".join(data for _, data in files)


def done_marker(nonce: str) -> bytes:
    """The start of the launcher's end-of-run marker; "produced:status:oom:" and a NUL follow."""
    return b"\n\x00execbox-done:%s:" % nonce.encode()


_MARKER_TAIL = re.compile(rb"([01]):(\d{1,3}|L\d):([01]):(\d{1,20}):\x00\Z")
_MARKER_TAIL_MAX = len(b"1:255:1::\x00") + 20
LAUNCHER_FAULTS = {
    b"L1": "the sandbox's init could not unpack the job's files",
    b"L2": "the sandbox's init could not start the language's program (is the image complete?)",
    b"L3": "the sandbox's init failed",
}
"""What the launcher reports in place of an exit status when it failed itself (launch.py FAULTS)."""
CLEANUP_DELAY_S = 0.05
"""Removing a container (~50 ms of engine work) starts this long after the run, so that on a small
machine it does not compete with storing the result and answering the client (measured on 2 cores:
warm end-to-end p50 56 -> 36 ms)."""
STATS_AFTER_S = 1.0
"""Runs still going after this are sampled through the engine's stats stream (for a peak when
no marker arrives, e.g. on timeout); shorter runs cost the engine no stats work."""


def host_config_kwargs(
    spec: RunSpec, settings: DockerSettings, uid: int, seccomp: str, network: str | None = None
) -> dict[str, Any]:
    """Every protection of DESIGN.md's 'Every sandbox, always', as engine settings; `uid` is the
    run's own user, `seccomp` the profile's JSON, `network` the run's own egress network (None: no
    network interface but loopback)."""
    lim = spec.limits
    workspace = DriverConfig(
        "local",
        {"type": "tmpfs", "device": "tmpfs", "o": f"size={lim.disk_mb}m,uid={uid},gid={uid},mode=0755,nosuid,nodev"},
    )
    kwargs: dict[str, Any] = {
        "network_mode": network or "none",
        "read_only": True,
        "mounts": [Mount(target=WORKDIR, source=None, type="volume", driver_config=workspace)],
        "tmpfs": {"/tmp": f"size={lim.disk_mb}m,uid={uid},gid={uid},mode=1777,nosuid,nodev,noexec"},
        "shm_size": f"{min(lim.disk_mb, 64)}m",
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        # The launcher (PID 1) is one process on top of the program's `pids`; see _pids_limit.
        "pids_limit": _pids_limit(lim.pids, policy_runtime(spec, settings)),
        # CFS quota rather than nano_cpus: the same limit, and one `docker update` can change it.
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": int(lim.cpu * CPU_PERIOD_US),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={seccomp}"],
        "cgroupns": "private",  # /proc/self/cgroup shows "/", not the host's path with the container id
        "oom_score_adj": settings.oom_score_adj,  # the host's OOM killer picks a sandbox before dockerd or Redis
        "ulimits": [
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="fsize", soft=lim.disk_mb << 20, hard=lim.disk_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="stack", soft=8 << 20, hard=8 << 20),
            Ulimit(name="cpu", soft=lim.cpu_time_s, hard=lim.cpu_time_s + 1),
            # Per uid, and the uid is the sandbox's own: the program and the launcher, nothing else.
            # Under gVisor this is what bounds the program's processes (see _pids_limit).
            Ulimit(name="nproc", soft=lim.pids + 1, hard=lim.pids + 1),
        ],
        "ipc_mode": "private",
        "privileged": False,
        "log_config": {"type": "none", "config": {}},
    }
    if network:
        # Names resolve at the proxy. The engine's resolver on an internal network answers nothing,
        # so a program's own lookups fail after 1 s instead of 10.
        kwargs["dns_opt"] = ["timeout:1", "attempts:1"]
    runtime = engine_runtime(policy_runtime(spec, settings), settings, network is not None)
    if runtime:
        kwargs["runtime"] = runtime
    return kwargs


def policy_runtime(spec: RunSpec, settings: DockerSettings) -> str:
    """The policy's runtime for this run (runc, runsc): the spec's, else the operator's default."""
    return spec.runtime or settings.runtime or "runc"


GVISOR_BASE_TASKS, GVISOR_TASKS_PER_TASK = 64, 6
"""Host tasks of a gVisor sandbox (ptrace platform), measured here: ~46 with one program task, then
~5.3 per program task (215 for 33, 383 for 65); with headroom."""


def _pids_limit(pids: int, runtime: str | None) -> int:
    """The pids cgroup counts host tasks. Under runc those are the program's processes and threads
    plus the launcher. Under gVisor they are the sandbox kernel's own threads (it fails to start,
    or crashes, when they run out), while the program's tasks live inside it and are bounded by
    RLIMIT_NPROC; the cgroup is then sized for gVisor at the program's full `pids`."""
    if runtime == "runsc":
        return GVISOR_BASE_TASKS + GVISOR_TASKS_PER_TASK * (pids + 1)
    return pids + 1


def engine_runtime(name: str, settings: DockerSettings, networked: bool) -> str | None:
    """The engine's runtime name for a policy's runtime: gVisor is registered twice, with its own
    network stack off (no network at all) and with the run's network namespace passed through."""
    if name == "runsc" and networked:
        return settings.runsc_network_runtime
    return None if name == "runc" else name


class _Capture:
    """Reads the multiplexed attach stream in its own thread: byte caps per stream, and the
    launcher's end-of-run marker at the end of stdout and of stderr. The engine copies the two
    streams independently, so the run's output is complete only when both markers have arrived."""

    def __init__(self, cap: int, marker: bytes, wake: threading.Event) -> None:
        self.cap = cap
        self.marker = marker
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.total = {STDOUT: 0, STDERR: 0}
        self.marked = {STDOUT: False, STDERR: False}
        self.overflowed = False
        self.produced = True
        self.exit_code: int | None = None
        self.fault: str | None = None
        self.oom = False
        self.peak: int | None = None
        self.eof = False
        self._slack = len(marker) + _MARKER_TAIL_MAX  # a stream may exceed its cap by the marker
        self._tail = {STDOUT: b"", STDERR: b""}
        self._wake = wake

    @property
    def done(self) -> bool:
        return self.marked[STDOUT] and self.marked[STDERR]

    def pump(self, sock: Any) -> None:
        try:
            for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
                if stream in self.kept:
                    self._take(stream, data)
        except (OSError, ValueError):
            pass  # the container went away, or the run is over and the stream closed; what was read is kept
        self.eof = True
        self._wake.set()

    def _take(self, stream: int, data: bytes) -> None:
        self.total[stream] += len(data)
        room = self.cap + self._slack - len(self.kept[stream])
        self.kept[stream] += data[: max(room, 0)]
        if not self.marked[stream]:
            self._tail[stream] = (self._tail[stream] + data)[-self._slack :]
            if self._tail[stream].endswith(b"\x00") and self._found_marker(stream):
                if self.done:
                    self._wake.set()
                return
        if self.total[stream] > self.cap + self._slack and not self.overflowed:
            self.overflowed = True
            self._wake.set()

    def _found_marker(self, stream: int) -> bool:
        tail = self._tail[stream]
        start = tail.rfind(self.marker)
        if start < 0:
            return False
        fields = _MARKER_TAIL.match(tail, start + len(self.marker))
        if fields is None:
            return False
        self.marked[stream] = True
        self.produced = fields.group(1) == b"1"
        status = fields.group(2)
        if status.startswith(b"L"):
            self.fault = LAUNCHER_FAULTS.get(status, LAUNCHER_FAULTS[b"L3"])
        else:
            self.exit_code = int(status)
        self.oom = fields.group(3) == b"1"
        self.peak = int(fields.group(4)) or None
        size = len(tail) - start
        self.total[stream] -= size
        if self.kept[stream].endswith(tail[start:]):
            del self.kept[stream][-size:]
        return True

    def result(self, stream: int) -> tuple[bytes, int, bool]:
        total = self.total[stream]
        return bytes(self.kept[stream][: self.cap]), total, total > self.cap


class DockerRuntime:
    def __init__(
        self, settings: DockerSettings, uids: UidAllocator | None = None, policies_dir: Path = DEFAULT_POLICIES
    ) -> None:
        self._settings = settings
        self.uids: UidAllocator = uids or LocalUids(settings.uid_range)
        """Per-sandbox uids; the worker gives one shared by every worker through Redis."""
        self._uid_of: dict[str, int] = {}
        self._profiles = SeccompProfiles(settings.seccomp_profile or policies_dir / "seccomp.json")
        self._client: docker.DockerClient | None = None
        self._image_ids: dict[str, str] = {}
        self.pool: WarmPool | None = None
        """Set by the worker when it keeps warm containers; None: every run creates its own."""
        self.on_status_mismatch: Callable[[], None] | None = None
        """Called when the engine's exit status contradicts the launcher's report (a metric)."""
        self._cleanup = _Deferred(CLEANUP_DELAY_S)

    def close(self, timeout_s: float = 30.0) -> None:
        """Run every pending clean-up now and wait for those under way (the worker is stopping)."""
        self._cleanup.flush(timeout_s)

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

    def runtimes(self) -> list[str]:
        """The OCI runtimes this worker's engine has registered and the operator offers."""
        with _docker_errors():
            registered = set((self.api.info().get("Runtimes") or {}).keys())
        offered = self._settings.offered_runtimes
        return sorted(registered if offered is None else registered & {*offered, self._settings.runsc_network_runtime})

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
        outcome: RunOutcome | None = None
        network: _EgressNetwork | None = None
        try:
            with _docker_errors():
                if spec.egress is not None:
                    network = self._open_egress(spec.execution_id, spec.deployment, spec.egress)
                    spec = dataclasses.replace(spec, env=spec.env + network.proxy_env(spec.egress.proxy_port))
                container_id = self.pool.take(spec) if self.pool is not None and network is None else None
                warm = container_id is not None
                if container_id is None:
                    labels = {EXECUTION_LABEL: spec.execution_id, TRACE_LABEL: spec.trace_id}
                    container_id = self._create(spec, self._labels(spec, labels), network)
                outcome = self._run_started(spec, control, container_id, image_id, t0, warm=warm)
                return outcome
        finally:
            # Off the result's path, and a moment later (see CLEANUP_DELAY_S). If this process
            # dies first, the reaper finds the container (and network) by their labels.
            reported = outcome if outcome is not None and outcome.launcher_status else None
            self._cleanup.later(lambda: self._retire(container_id, reported, network))

    def _open_egress(self, execution_id: str, deployment: str, egress: EgressSpec) -> _EgressNetwork:
        """An internal network of the run's own (no route out, no address for the host on it) with
        the egress proxy attached; the proxy's address there identifies the run. Its /28 is reserved
        for the run in Redis and cools down after it, so an address never changes hands quickly."""
        pool = ipaddress.ip_network(egress.subnet_pool)
        slots = 2 ** (28 - pool.prefixlen)
        deadline = time.monotonic() + egress.slot_wait_s
        while True:
            # Small pools are tried in full, in random order; large ones by a few random draws.
            order = secrets.SystemRandom().sample(range(slots), min(slots, 16))
            for index in order:
                subnet = ipaddress.ip_network((int(pool.network_address) + index * 16, 28))
                if not egress.reserve(str(subnet)):
                    continue
                network = self._create_egress_network(execution_id, deployment, egress, subnet)
                if network is not None:
                    return network
                egress.release(str(subnet))  # another deployment on this engine holds it
            if time.monotonic() >= deadline:
                raise RuntimeUnavailable(
                    f"no free /28 in the egress subnet pool {pool}: every slot tried is in use or cooling down "
                    "after a run (EXECBOX_EGRESS__SLOT_COOLDOWN_S); retry, or give the pool more room"
                )
            time.sleep(0.2)  # slots free up by expiry in Redis, which sends no notification here

    def _create_egress_network(
        self,
        execution_id: str,
        deployment: str,
        egress: EgressSpec,
        subnet: ipaddress.IPv4Network | ipaddress.IPv6Network,
    ) -> _EgressNetwork | None:
        api = self.api
        labels = {MANAGED_LABEL: "true", DEPLOYMENT_LABEL: deployment, EXECUTION_LABEL: execution_id}
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet), gateway=str(subnet[1]))])
        try:
            created = api.create_network(
                f"execbox-{execution_id}-{subnet.network_address}", driver="bridge", internal=True, ipam=ipam,
                labels=labels, options={"com.docker.network.bridge.inhibit_ipv4": "true"},
            )  # fmt: skip
        except APIError as exc:
            if "overlap" in str(exc).lower():
                return None
            raise
        network = _EgressNetwork(
            str(created["Id"]), str(subnet[2]), egress.proxy_container, str(subnet), egress.release
        )
        try:
            api.connect_container_to_network(egress.proxy_container, network.id, ipv4_address=network.proxy)
            egress.register(network.proxy)
        except NotFound as exc:
            self._close_egress(network)
            raise RuntimeUnavailable(
                f"the egress proxy container {egress.proxy_container!r} is not running on this worker's engine "
                "(EXECBOX_EGRESS__CONTAINER; `make up` starts it)"
            ) from exc
        except BaseException:
            self._close_egress(network)
            raise
        return network

    def _close_egress(self, network: _EgressNetwork) -> None:
        try:
            self.api.disconnect_container_from_network(network.proxy_container, network.id, force=True)
        except (DockerException, requests.RequestException):
            pass  # not connected (any more)
        try:
            self.api.remove_network(network.id)
        except NotFound:
            pass
        except (DockerException, requests.RequestException) as exc:
            log.warning("could not remove network %s: %s", network.id[:12], exc)  # the reaper retries
            return  # the slot stays reserved until its reservation lapses
        if network.release is not None:
            try:
                network.release(network.subnet)
            except Exception as exc:  # the reservation lapses on its own
                log.warning("could not start the cool-down of slot %s: %s", network.subnet, exc)

    def _retire(self, container_id: str | None, reported: RunOutcome | None, network: _EgressNetwork | None) -> None:
        """Remove a run's container; when the result took status and OOM from the launcher's
        marker, first let the launcher exit and check the engine agrees (a mismatch would mean
        a forged marker: logged and counted, see docs/security.md C26)."""
        if reported is not None and container_id is not None:
            self._signal(container_id, RELEASE_SIGNAL)
            exit_code = self._wait(container_id, 10.0)
            try:
                oom = bool(self.api.inspect_container(container_id)["State"].get("OOMKilled"))
            except (DockerException, requests.RequestException):
                oom = reported.oom_killed
            if exit_code is not None and (exit_code, oom) != (reported.exit_code, reported.oom_killed):
                log.error(
                    "sandbox status mismatch: the launcher reported exit %s, OOM %s; the engine says exit %s, OOM %s",
                    reported.exit_code, reported.oom_killed, exit_code, oom,
                    extra={"container_id": container_id[:12]},
                )  # fmt: skip
                if self.on_status_mismatch is not None:
                    self.on_status_mismatch()
        if container_id is not None:
            self.remove(container_id)
        if network is not None:
            self._close_egress(network)

    @staticmethod
    def _labels(spec: RunSpec, extra: dict[str, str]) -> dict[str, str]:
        return {MANAGED_LABEL: "true", DEPLOYMENT_LABEL: spec.deployment, WORKER_LABEL: spec.worker, **extra}

    def _create(self, spec: RunSpec, labels: dict[str, str], network: _EgressNetwork | None = None) -> str:
        """Create (not start) a hardened container for spec's image, command and limits, running as
        a uid no other live sandbox has (per-uid kernel limits are then the run's own)."""
        api = self.api
        uid = self.uids.reserve()
        try:
            gvisor = policy_runtime(spec, self._settings) == "runsc"
            seccomp = self._profiles.json(spec.seccomp_deny, gvisor=gvisor)
            kwargs = host_config_kwargs(spec, self._settings, uid, seccomp, network.id if network else None)
            host_config = api.create_host_config(**kwargs)
            host_config["MaskedPaths"] = list(MASKED_PATHS)
            launcher = GVISOR_LAUNCHER if gvisor else LAUNCHER
            created = self._create_container(spec, labels, network, host_config, uid, launcher)
        except BaseException:
            self.uids.release(uid)
            raise
        self._uid_of[created] = uid
        return created

    def _create_container(
        self,
        spec: RunSpec,
        labels: dict[str, str],
        network: _EgressNetwork | None,
        host_config: Any,
        uid: int,
        launcher: tuple[str, ...],
    ) -> str:
        created = self.api.create_container(
            spec.image,
            command=[*launcher, *spec.command],
            user=f"{uid}:{uid}",
            working_dir=WORKDIR,
            environment=BASE_ENV,
            stdin_open=True,
            tty=False,
            hostname="sandbox",
            network_disabled=network is None,
            labels={**labels, UID_LABEL: str(uid)},
            host_config=host_config,
        )
        return str(created["Id"])

    def create_pooled(self, spec: RunSpec, pool_class: str) -> str:
        """A warm-pool container: created and started, its launcher waiting for a frame on stdin."""
        with _docker_errors():
            cid = self._create(spec, self._labels(spec, {POOL_LABEL: pool_class}))
            try:
                self.api.start(cid)
            except BaseException:
                self.remove(cid)
                raise
            return cid

    def resize(self, container_id: str, held: Limits, wanted: Limits) -> None:
        """Apply a run's memory and CPU limits to a pooled container made with the class's."""
        if (held.memory_mb, held.cpu) == (wanted.memory_mb, wanted.cpu):
            return
        with _docker_errors():
            self.api.update_container(
                container_id,
                mem_limit=f"{wanted.memory_mb}m",
                memswap_limit=f"{wanted.memory_mb}m",
                cpu_period=CPU_PERIOD_US,
                cpu_quota=int(wanted.cpu * CPU_PERIOD_US),
            )

    def _run_started(
        self, spec: RunSpec, control: RunControl, cid: str, image_id: str, t0: float, warm: bool
    ) -> RunOutcome:
        api = self.api
        nonce = secrets.token_hex(8)
        wake = threading.Event()
        capture = _Capture(spec.limits.output_bytes, done_marker(nonce), wake)
        sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        reader = threading.Thread(target=capture.pump, args=(sock,), name=f"capture-{spec.execution_id}", daemon=True)
        reader.start()
        if not warm:
            api.start(cid)
        if spec.input_archive:
            api.put_archive(cid, WORKDIR, spec.input_archive)
        started = time.monotonic()
        control.set_killer(wake.set)
        payload = frame_files(spec.files, nonce, spec.env) + spec.stdin
        threading.Thread(target=_feed, args=(raw, payload), daemon=True).start()
        # Not joined: the stats stream ends by itself when the container is removed.
        peak: list[int] = []
        # gVisor does not enforce RLIMIT_CPU: there the sandbox cgroup's CPU time is watched instead.
        cpu_over = threading.Event()
        cpu_cap_ns = spec.limits.cpu_time_s * 10**9 if policy_runtime(spec, self._settings) == "runsc" else None
        sampler = threading.Timer(STATS_AFTER_S, self._sample, args=(cid, peak, cpu_cap_ns, cpu_over, wake))
        sampler.daemon = True
        sampler.start()

        wake.wait(timeout=spec.limits.timeout_s)
        sampler.cancel()
        ended = time.monotonic()
        timed_out = not wake.is_set()
        stopped = capture.overflowed or control.cancelled or cpu_over.is_set()
        finished = capture.done and not (timed_out or stopped)
        collect_error: str | None = None
        fault = capture.fault if finished else None
        if finished and fault is None:
            # The launcher says whether out/ is empty; a program can only lie about its own files.
            if capture.produced or spec.collect_path != "out":
                collect_error = self._collect(cid, spec)
        elif finished:
            pass  # the launcher failed before or instead of the program: nothing of the run to collect
        elif not capture.eof:
            # Stopped from outside (timeout, output cap, cancel): freeze every process so the
            # collection sees a still workspace, then kill.
            collect_error = self._collect(cid, spec, freeze=True)
            self._signal(cid, "SIGKILL")
        else:
            collect_error = "the sandbox ended before its output directory could be collected"
        collected_at = time.monotonic()
        if finished:
            # The launcher's marker carries the program's status and the cgroup's OOM count; the
            # container itself is removed (killed) off the result's path.
            exit_code, oom_killed = capture.exit_code, capture.oom
            _close(sock)
        else:
            exit_code = self._wait(cid, 10.0)
            reader.join(timeout=5.0)
            state = api.inspect_container(cid)["State"]
            _close(sock)
            exit_code = exit_code if exit_code is not None else state.get("ExitCode")
            oom_killed = bool(state.get("OOMKilled"))
            if capture.eof and not (timed_out or stopped or oom_killed):
                # It ended by itself without the launcher's report: the launcher died, not the program.
                fault = f"the sandbox's init ended without reporting the run (exit code {exit_code})"
        stdout, stdout_total, stdout_over = capture.result(STDOUT)
        stderr, stderr_total, stderr_over = capture.result(STDERR)
        return RunOutcome(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            stdout_total=stdout_total,
            stderr_total=stderr_total,
            stdout_truncated=stdout_over,
            stderr_truncated=stderr_over,
            timed_out=timed_out,
            cancelled=control.cancelled,
            oom_killed=oom_killed,
            peak_memory_bytes=capture.peak or (max(peak) if peak else None),
            image_id=image_id,
            start_ms=(started - t0) * 1000,
            run_ms=(ended - started) * 1000,
            collect_ms=(collected_at - ended) * 1000,
            collect_error=collect_error if spec.collector else None,
            warm=warm,
            launcher_status=finished and fault is None,
            launcher_fault=fault,
            cpu_exhausted=cpu_over.is_set(),
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

    def _sample(
        self, cid: str, peak: list[int], cpu_cap_ns: int | None, cpu_over: threading.Event, wake: threading.Event
    ) -> None:
        # cgroup v1 reports max_usage (the high-water mark); v2 only the current usage.
        try:
            for stats in self.api.stats(cid, decode=True, stream=True):
                memory = stats.get("memory_stats") or {}
                value = memory.get("max_usage") or memory.get("usage")
                if value:
                    peak.append(int(value))
                used = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0
                if cpu_cap_ns is not None and used >= cpu_cap_ns:
                    cpu_over.set()
                    wake.set()
                    return
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
            return
        uid = self._uid_of.pop(container_id, None)
        if uid is not None:
            self.uids.release(uid)  # only now: its container is gone

    def managed_networks(self, deployment: str) -> list[ContainerInfo]:
        """The per-run egress networks this deployment made on this engine (as reaper entries)."""
        labels = [f"{MANAGED_LABEL}=true", f"{DEPLOYMENT_LABEL}={deployment}"]
        with _docker_errors():
            found = self.api.networks(filters={"label": labels})
        return [
            ContainerInfo(
                id=n["Id"],
                execution_id=(n.get("Labels") or {}).get(EXECUTION_LABEL),
                created_at=_unix_time(n.get("Created", "")),
                running=False,
            )
            for n in found
        ]

    def remove_network(self, network_id: str, proxy_container: str) -> None:
        self._close_egress(_EgressNetwork(network_id, "", proxy_container))

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
                worker=(c.get("Labels") or {}).get(WORKER_LABEL),
                pool=(c.get("Labels") or {}).get(POOL_LABEL),
            )
            for c in found
        ]


class _Deferred:
    """Clean-up actions run a moment after a run (off the result's path), or all at once by flush()
    when the worker stops, so that none is lost with the process."""

    def __init__(self, delay_s: float) -> None:
        self._delay_s = delay_s
        self._pending: dict[int, Callable[[], None]] = {}
        self._next = itertools.count()
        self._running = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def later(self, action: Callable[[], None]) -> None:
        with self._lock:
            key = next(self._next)
            self._pending[key] = action
        timer = threading.Timer(self._delay_s, self._run, args=(key,))
        timer.daemon = True
        timer.start()

    def _run(self, key: int) -> None:
        with self._lock:
            action = self._pending.pop(key, None)
            if action is None:
                return  # flush() took it
            self._running += 1
        try:
            action()
        except Exception:
            log.exception("sandbox clean-up failed; the reaper will retry")
        finally:
            with self._lock:
                self._running -= 1
                self._idle.notify_all()

    def flush(self, timeout_s: float) -> None:
        with self._lock:
            actions = list(self._pending.values())
            self._pending.clear()
        for action in actions:
            try:
                action()
            except Exception:
                log.exception("sandbox clean-up failed; the reaper will retry")
        with self._lock:
            self._idle.wait_for(lambda: self._running == 0, timeout_s)


@dataclass(frozen=True)
class _EgressNetwork:
    id: str
    proxy: str
    """The proxy's address on this network."""
    proxy_container: str
    subnet: str = ""
    release: Callable[[str], None] | None = None
    """Starts the slot's cool-down once the network is removed (None: a reaper sweep's network)."""

    def proxy_env(self, port: int) -> tuple[tuple[str, str], ...]:
        url = f"http://{self.proxy}:{port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
        return tuple((name, url) for name in names) + (("NO_PROXY", ""), ("no_proxy", ""))


def _unix_time(created: str) -> float:
    """The engine's RFC 3339 time (nanoseconds, Z or offset) as Unix time; 0 when unreadable."""
    try:
        stamp = re.sub(r"(\.\d{6})\d+", r"\1", created).replace("Z", "+00:00")
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def _feed(raw: socket.socket, data: bytes) -> None:
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the program ended (or was killed) before reading everything


def _close(sock: Any) -> None:
    """Close the attach stream: shut the socket down first, which wakes the reader thread still
    blocked in recv (close() alone would not, and the engine keeps the stream open), then close the
    file wrapper docker-py returns and the socket under it."""
    raw = getattr(sock, "_sock", sock)
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the engine
    for part in (sock, raw):
        try:
            part.close()
        except OSError:
            pass
