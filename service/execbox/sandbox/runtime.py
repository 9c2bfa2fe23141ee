"""The runtime seam: what a sandbox run takes (SandboxSpec) and gives back (SandboxOutcome)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

MANAGED_LABEL = "execbox.managed"
EXECUTION_LABEL = "execbox.execution_id"
TRACE_LABEL = "execbox.trace_id"
WORKER_LABEL = "execbox.worker"
DEPLOYMENT_LABEL = "execbox.deployment"
POOL_LABEL = "execbox.pool"
"""On warm-pool containers: the class they were made for (they carry no execution label)."""
POOL_MEMORY_LABEL = "execbox.pool.memory_mb"
"""On warm-pool containers: their class's memory limit, which the host's pool budget counts."""
SESSION_LABEL = "execbox.session"
"""On a session's container: the session it holds (it carries no execution label)."""
UID_LABEL = "execbox.uid"
"""The sandbox's own uid (distinct among live sandboxes)."""
WORKDIR = "/workspace"


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    cpu: float
    cpu_time_s: int
    memory_mb: int
    pids: int
    disk_mb: int
    output_bytes: int


class TarSink(Protocol):
    """Takes the tar stream of the collected path (execbox.files.collect.Collector is the one)."""

    only: frozenset[str] | None
    """Set by a session's call before it collects: only these names are the call's (None: all)."""

    def __call__(self, chunks: Iterator[bytes]) -> None: ...


class EgressLease(Protocol):
    """The run's hold on the egress path (execbox.egress.store.RunEgress is the one). Only the
    engine knows which /28 of the pool it can create a network in (another deployment on it may
    hold one), so the runtime asks while it tries them."""

    def reserve(self, subnet: str) -> bool:
        """Claim a /28 of the pool (by its text) for this run; False when another run holds it or
        its cool-down after a previous run has not passed."""

    def release(self, subnet: str) -> None:
        """The run's network is gone (or was never made): the /28 starts its cool-down."""

    def register(self, proxy_address: str) -> None:
        """The proxy's address on the run's network, before the program starts: the run's rule is
        kept under it."""


@dataclass(frozen=True)
class EgressSpec:
    """Network through the egress proxy: the run gets a network of its own that only the proxy shares."""

    proxy_container: str
    proxy_port: int
    subnet_pool: str
    lease: EgressLease
    slot_wait_s: float = 0.0
    """How long to wait for a slot when every one is held or cooling down, before failing."""


@dataclass(frozen=True)
class SandboxSpec:
    execution_id: str
    trace_id: str
    worker: str
    image: str
    command: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...]
    """Small service files (the code, inputs.json): written by the launcher before the program."""
    env: tuple[tuple[str, str], ...]
    limits: Limits
    language: str = ""
    deployment: str = "execbox"
    """Which execbox installation made the container; reapers only touch their own."""
    input_archive: bytes | None = None
    """A tar of the request's input files, copied into /workspace through the engine's archive API."""
    stdin: bytes = b""
    collect_path: str = "out"
    """Path under /workspace handed (as a tar stream from the engine) to `collector` after the run."""
    collector: TarSink | None = None
    egress: EgressSpec | None = None
    """None: no network interface but loopback."""
    runtime: str | None = None
    """The policy's OCI runtime (`runc`, `runsc`, ...); None: the operator's default."""
    seccomp_deny: tuple[str, ...] = ()
    """System calls denied on top of execbox's seccomp profile (a policy may only narrow it)."""
    on_output: Callable[[int, bytes], None] | None = None
    """Told each piece of output as it arrives (stream 1 or 2, bytes): live output for streaming."""
    container_env: tuple[tuple[str, str], ...] = ()
    """The container's own environment on top of the base one (the launcher's, and a preloaded
    interpreter's: warm-pool templates only); a run's environment travels in its frame."""
    session_context: str = ""
    """In a session: the context the cell runs in ("": the default; see the kernel)."""
    submitted_at: float = 0.0
    """When the execution was accepted (Unix time): the warm pool sizes itself by arrivals, which
    a busy worker's takes would spread out."""

    @property
    def preloads(self) -> bool:
        """Whether containers made from this spec start a preloaded interpreter (only the templates
        of preloading pool classes have a container environment)."""
        return bool(self.container_env)


@dataclass(frozen=True)
class SandboxOutcome:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    cancelled: bool = False
    oom_killed: bool = False
    peak_memory_bytes: int | None = None
    image_id: str | None = None
    start_ms: float = 0.0
    run_ms: float = 0.0
    collect_ms: float = 0.0
    collect_error: str | None = None
    """Why the output directory could not be collected (None when it was, or nobody asked)."""
    warm: bool = False
    """The container came from the warm pool."""
    launcher_status: bool = False
    """exit_code and oom_killed are the launcher's report (its end-of-run marker), checked against
    the engine after the result is stored; False: read from the engine before the result."""
    cpu_exhausted: bool = False
    """Stopped by the worker when the sandbox's CPU time passed cpu_time_s (where RLIMIT_CPU does
    not hold, i.e. under gVisor)."""
    launcher_fault: str | None = None
    """The sandbox's init failed (its report says so, or it ended without one): a service error,
    never the program's outcome."""
    kernel_restarted: bool = False
    """A session's call: its kernel was restarted after it (variables gone, workspace kept)."""
    session_note: str | None = None
    """A session's call: what the kernel's supervisor said about a restart."""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    execution_id: str | None
    created_at: float
    running: bool
    worker: str | None = None
    pool: str | None = None
    session: str | None = None
    pool_memory_mb: int = 0
    """A warm-pool container's class memory limit (0: not one)."""


@dataclass
class SandboxControl:
    """Lets another thread stop a run: cancel() kills the sandbox as soon as one exists."""

    cancelled: bool = False
    _killer: Callable[[], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_killer(self, killer: Callable[[], None]) -> None:
        with self._lock:
            self._killer = killer
            kill_now = self.cancelled
        if kill_now:
            killer()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            killer = self._killer
        if killer is not None:
            killer()


class SessionSandbox(Protocol):
    """A session's container: one kernel kept across calls, one call at a time."""

    gone: str | None
    """Why it can take no more calls (its sandbox ended, its kernel stopped answering); None while usable."""

    def run_cell(self, spec: SandboxSpec, code: str, control: SandboxControl) -> SandboxOutcome:
        """Run code in the kernel under spec's timeout and output cap; spec's files, input archive
        and environment are the call's; spec.collector receives what the call wrote in out/."""

    def close(self) -> None:
        """Remove the container (and with it the kernel and the workspace)."""

    def op(self, request: dict[str, Any]) -> None:
        """Send a file or process request beside the cells (its "id" is the caller's; the requests
        and their answers are sandbox-images/common/session_ops.py's)."""

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Where everything the sandbox says outside a cell goes (answers to `op`, a process's
        output and end), from the thread that reads the sandbox; replaces the one before."""


class SandboxRunner(Protocol):
    """The execution seam: everything an execution's life needs of a sandbox (a one-shot run, or a
    session whose calls run one after another in one kernel). DockerRuntime and FakeRuntime
    (execbox.sandbox.fake) are the two."""

    def run(self, spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        """Run spec in a fresh container and remove it afterwards, whatever happens."""

    def open_session(self, spec: SandboxSpec, session_id: str, start_timeout_s: float) -> SessionSandbox:
        """Create and start a session's container (spec.command is the session program) and wait
        until its kernel is ready; raises a ServiceError when it cannot."""


class EngineHealth(Protocol):
    """What the worker's heartbeat reports about the engine (execbox.worker.reaper.report_health)."""

    def ping(self) -> None:
        """Raise RuntimeUnavailable when the engine cannot be reached."""

    def image_id(self, image: str) -> str:
        """The image's id; ImageUnavailable when the engine does not have it."""

    def runtimes(self) -> list[str]:
        """The OCI runtimes the engine has registered (runc, runsc, ...)."""


class Housekeeping(Protocol):
    """What the reaper and the worker's shutdown need: find and remove what dead runs left behind."""

    def managed_containers(self, deployment: str) -> list[ContainerInfo]:
        """Every sandbox container this deployment made on this engine."""

    def remove(self, container_id: str) -> None:
        """Kill and remove a container; a missing one is not an error."""

    def close(self) -> None:
        """Finish every pending clean-up (removals) before the process exits."""

    def managed_networks(self, deployment: str) -> list[ContainerInfo]:
        """Every per-run egress network this deployment made on this engine."""

    def remove_network(self, network_id: str, proxy_container: str) -> None:
        """Detach the egress proxy from a run's network and remove it; a missing one is not an error."""


class Runtime(SandboxRunner, EngineHealth, Housekeeping, Protocol):
    """A worker's engine: the execution seam plus health and housekeeping. The warm pool is not part
    of it: it drives DockerRuntime through its own narrower seam (execbox.sandbox.pool.PoolEngine)."""
