"""DockerRuntime: one hardened container per run, through the engine's API.

The code never travels in a shell string (see execbox.sandbox.protocol for what the launcher
reads on stdin). The request's input files are copied into /workspace through the engine's
archive API. /workspace is a size-capped tmpfs volume, so it stays readable through the engine
(get_archive) until the container is removed: the launcher holds the container open after the
program ends until the worker has collected the output directory, and the container is then
removed.

A container comes from the warm pool (created and started with the same hardening before the
request arrived, waiting on stdin; used once) when the worker keeps one for the run's class, and
is created on the spot otherwise. The per-request environment travels in the stdin frame for both.

Longer than 400 lines because a run's lifecycle (create, attach, start, feed, wait, collect, stop,
retire) is one sequence whose steps share the container's state; the parts that stand alone live
beside it (hostconfig, capture, networks, cleanup, engine).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from execbox.sandbox.bwrap.runtime import NAME as BWRAP
from execbox.sandbox.bwrap.runtime import BwrapRuntime
from execbox.sandbox.docker.capture import STDERR, STDOUT, AttachCapture, close, feed
from execbox.sandbox.docker.cleanup import CLEANUP_DELAY_S, Deferred
from execbox.sandbox.docker.engine import docker_errors, listed_containers, listed_networks
from execbox.sandbox.docker.hostconfig import (
    CPU_PERIOD_US,
    DEFAULT_CPU_SHARES,
    MASKED_PATHS,
    host_config_kwargs,
    policy_runtime,
)
from execbox.sandbox.docker.kernel import KernelContainer
from execbox.sandbox.docker.networks import EgressNetwork, EgressNetworks
from execbox.sandbox.errors import ImageUnavailable, RuntimeUnavailable
from execbox.sandbox.pool import WarmPool
from execbox.sandbox.protocol import BASE_ENV, GVISOR_LAUNCHER, LAUNCHER, RELEASE_SIGNAL, done_marker, frame_files
from execbox.sandbox.runtime import (
    DEPLOYMENT_LABEL,
    EXECUTION_LABEL,
    MANAGED_LABEL,
    POOL_LABEL,
    POOL_MEMORY_LABEL,
    TRACE_LABEL,
    UID_LABEL,
    WORKDIR,
    WORKER_LABEL,
    ContainerInfo,
    Limits,
    SandboxControl,
    SandboxOutcome,
    SandboxSpec,
)
from execbox.sandbox.seccomp import SeccompProfiles
from execbox.sandbox.settings import DockerSettings
from execbox.sandbox.uids import LocalUids, UidAllocator

log = logging.getLogger(__name__)
DEFAULT_POLICIES = Path(__file__).resolve().parents[4] / "policies"

STATS_AFTER_S = 1.0
"""Runs still going after this are sampled through the engine's stats stream (for a peak when
no marker arrives, e.g. on timeout); shorter runs cost the engine no stats work."""
SIGNALLED = 128
"""An init's exit code above this is 128 + the signal that ended it."""


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
        self._cleanup = Deferred(CLEANUP_DELAY_S)
        self._networks = EgressNetworks(lambda: self.api)
        self.bwrap = BwrapRuntime(settings.bwrap_socket, self.uids, self.image_id) if settings.bwrap_socket else None
        """Runs whose policy asks for `bwrap` (execbox.sandbox.bwrap): same images, same uids, no container."""

    def close(self, timeout_s: float = 30.0) -> None:
        """Run every pending clean-up now and wait for those under way (the worker is stopping)."""
        self._cleanup.flush(timeout_s)

    @property
    def api(self) -> docker.APIClient:
        if self._client is None:
            with docker_errors():
                timeout = int(self._settings.api_timeout_s)
                self._client = (
                    docker.DockerClient(base_url=self._settings.url, timeout=timeout, version="auto")
                    if self._settings.url
                    else docker.from_env(timeout=timeout, version="auto")
                )
        return self._client.api

    def ping(self) -> None:
        with docker_errors():
            self.api.ping()

    def runtimes(self) -> list[str]:
        """The OCI runtimes this worker's engine has registered and the operator offers."""
        with docker_errors():
            registered = set((self.api.info().get("Runtimes") or {}).keys())
        if self.bwrap is not None:
            registered.add(BWRAP)
        offered = self._settings.offered_runtimes
        return sorted(registered if offered is None else registered & {*offered, self._settings.runsc_network_runtime})

    def image_id(self, image: str) -> str:
        if image not in self._image_ids:
            with docker_errors():
                self._image_ids[image] = str(self.api.inspect_image(image)["Id"])  # type: ignore[no-untyped-call]
        return self._image_ids[image]

    def run(self, spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        if spec.runtime == BWRAP:
            if self.bwrap is None:
                raise RuntimeUnavailable("this worker has no bubblewrap helper (EXECBOX_DOCKER__BWRAP_SOCKET)")
            return self.bwrap.run(spec, control)
        t0 = time.monotonic()
        try:
            image_id = self.image_id(spec.image)
        except ImageUnavailable:
            self._image_ids.pop(spec.image, None)
            raise
        container_id: str | None = None
        outcome: SandboxOutcome | None = None
        network: EgressNetwork | None = None
        try:
            with docker_errors():
                if spec.egress is not None:
                    network = self._networks.open(spec.execution_id, spec.deployment, spec.egress)
                    spec = dataclasses.replace(spec, env=spec.env + network.proxy_env(spec.egress.proxy_port))
                container_id = self.pool.take(spec) if self.pool is not None and network is None else None
                warm = container_id is not None
                if container_id is None:
                    container_id = self.create(spec, network)
                outcome = self.run_in(spec, control, container_id, image_id, t0, warm=warm)
                return outcome
        finally:
            # Off the result's path, and a moment later (see CLEANUP_DELAY_S). If this process
            # dies first, the reaper finds the container (and network) by their labels.
            reported = outcome if outcome is not None and outcome.launcher_status else None
            self._cleanup.later(lambda: self.retire(container_id, reported, network))

    def retire(
        self, container_id: str | None, reported: SandboxOutcome | None, network: EgressNetwork | None = None
    ) -> None:
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
            self._networks.close(network)

    @staticmethod
    def labels(spec: SandboxSpec, extra: dict[str, str]) -> dict[str, str]:
        return {MANAGED_LABEL: "true", DEPLOYMENT_LABEL: spec.deployment, WORKER_LABEL: spec.worker, **extra}

    def create(self, spec: SandboxSpec, network: EgressNetwork | None = None) -> str:
        """A created (not started) container for one run, labelled with its execution and trace."""
        labels = {EXECUTION_LABEL: spec.execution_id, TRACE_LABEL: spec.trace_id}
        return self.create_labelled(spec, self.labels(spec, labels), network)

    def open_session(self, spec: SandboxSpec, session_id: str, start_timeout_s: float) -> KernelContainer:
        """A session's container, started, its kernel ready (see execbox.sandbox.docker.kernel)."""
        session = KernelContainer(self, spec, session_id)
        try:
            session.open(start_timeout_s)
        except BaseException:
            session.close()
            raise
        return session

    def create_labelled(self, spec: SandboxSpec, labels: dict[str, str], network: EgressNetwork | None = None) -> str:
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
        spec: SandboxSpec,
        labels: dict[str, str],
        network: EgressNetwork | None,
        host_config: Any,
        uid: int,
        launcher: tuple[str, ...],
    ) -> str:
        created = self.api.create_container(
            spec.image,
            command=[*launcher, *spec.command],
            user=f"{uid}:{uid}",
            working_dir=WORKDIR,
            environment={**BASE_ENV, **dict(spec.container_env)},
            stdin_open=True,
            tty=False,
            hostname="sandbox",
            network_disabled=network is None,
            labels={**labels, UID_LABEL: str(uid)},
            host_config=host_config,
        )
        return str(created["Id"])

    def create_pooled(self, spec: SandboxSpec, pool_class: str) -> str:
        """A warm-pool container: created and started, its launcher waiting for a frame on stdin."""
        with docker_errors():
            labels = {POOL_LABEL: pool_class, POOL_MEMORY_LABEL: str(spec.limits.memory_mb)}
            cid = self.create_labelled(spec, self.labels(spec, labels))
            try:
                self.api.start(cid)
            except BaseException:
                self.remove(cid)
                raise
            return cid

    def resize(self, container_id: str, held: Limits, wanted: Limits, full_weight: bool = False) -> None:
        """Apply a run's memory and CPU limits to a pooled container made with the class's, and
        with `full_weight` the default CPU weight to one that waited with the lowest."""
        if (held.memory_mb, held.cpu) == (wanted.memory_mb, wanted.cpu):
            if full_weight:  # the weight alone: the run need not wait for the engine (~30 ms) for it
                threading.Thread(target=self._full_weight, args=(container_id,), daemon=True).start()
            return
        with docker_errors():
            self.api.update_container(
                container_id,
                mem_limit=f"{wanted.memory_mb}m",
                memswap_limit=f"{wanted.memory_mb}m",
                cpu_period=CPU_PERIOD_US,
                cpu_quota=int(wanted.cpu * CPU_PERIOD_US),
                cpu_shares=DEFAULT_CPU_SHARES if full_weight else None,
            )

    def _full_weight(self, container_id: str) -> None:
        try:
            self.api.update_container(container_id, cpu_shares=DEFAULT_CPU_SHARES)
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:  # the run ended first
            log.debug("could not restore the CPU weight of %s: %s", container_id[:12], exc)

    def run_in(
        self, spec: SandboxSpec, control: SandboxControl, cid: str, image_id: str, t0: float, warm: bool
    ) -> SandboxOutcome:
        """Run spec in a container made for it (created, or warm and started); the caller retires it."""
        api = self.api
        nonce = secrets.token_hex(8)
        wake = threading.Event()
        capture = AttachCapture(spec.limits.output_bytes, done_marker(nonce), wake, spec.on_output)
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
        threading.Thread(target=feed, args=(raw, payload), daemon=True).start()
        # Not joined: the stats stream ends by itself when the container is removed.
        peak: list[int] = []
        # gVisor does not enforce RLIMIT_CPU: there the sandbox cgroup's CPU time is watched instead.
        cpu_over = threading.Event()
        gvisor = policy_runtime(spec, self._settings) == "runsc"
        cpu_cap_ns = spec.limits.cpu_time_s * 10**9 if gvisor else None
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
                collect_error = self.collect(cid, spec)
        elif finished:
            pass  # the launcher failed before or instead of the program: nothing of the run to collect
        elif not capture.eof:
            # Stopped from outside (timeout, output cap, cancel): freeze every process so the
            # collection sees a still workspace, then kill.
            collect_error = self.collect(cid, spec, freeze=True)
            self._signal(cid, "SIGKILL")
        else:
            collect_error = "the sandbox ended before its output directory could be collected"
        collected_at = time.monotonic()
        if finished:
            # The launcher's marker carries the program's status and the cgroup's OOM count; the
            # container itself is removed (killed) off the result's path.
            exit_code, oom_killed = capture.exit_code, capture.oom
            close(sock)
        else:
            exit_code = self._wait(cid, 10.0)
            reader.join(timeout=5.0)
            state = api.inspect_container(cid)["State"]
            close(sock)
            exit_code = exit_code if exit_code is not None else state.get("ExitCode")
            oom_killed = bool(state.get("OOMKilled"))
            # gVisor delivers a program's signals to PID 1, which Linux drops: a launcher killed by a
            # signal the worker did not send was killed by the program (its own outcome, not ours).
            killed_by_program = gvisor and exit_code is not None and exit_code > SIGNALLED
            if capture.eof and not (timed_out or stopped or oom_killed or killed_by_program):
                # It ended by itself without the launcher's report: the launcher died, not the program.
                fault = f"the sandbox's init ended without reporting the run (exit code {exit_code})"
        if not finished:
            capture.flush_held()
        stdout, stdout_total, stdout_over = capture.result(STDOUT)
        stderr, stderr_total, stderr_over = capture.result(STDERR)
        return SandboxOutcome(
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

    def collect(self, cid: str, spec: SandboxSpec, freeze: bool = False) -> str | None:
        """Hand spec.collector the tar stream of the container's collect path; why not, if it failed."""
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
        return listed_networks(self.api, deployment)

    def remove_network(self, network_id: str, proxy_container: str) -> None:
        self._networks.close(EgressNetwork(network_id, "", proxy_container))

    def managed_containers(self, deployment: str) -> list[ContainerInfo]:
        return listed_containers(self.api, deployment)
