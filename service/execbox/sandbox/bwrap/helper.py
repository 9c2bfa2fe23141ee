"""`execbox bwrap-helper`: the one root process of the bubblewrap runtime, one per sandbox host.

Workers keep no root. A worker connects to this helper's unix socket (its group may, no one else)
and sends one run (execbox.sandbox.bwrap.wire). The helper checks every field against its own
settings, never the worker's word: the image must be a sandbox image of the engine, the uid in
the helper's range, the command the launcher's, the limits within bounds; the seccomp profile is
the helper's own file, which a run may only narrow. Then it makes the run's cgroup (memory and
swap, pids, CPU) and its workspace (a tmpfs of the run's disk size, owned by the run's uid) and
starts bubblewrap: new mount, pid, network, IPC, UTS and cgroup namespaces made by root (no user
namespace), the image's tree read-only, /tmp a size-capped tmpfs, a minimal /dev, /proc, the
seccomp filter, and `setpriv` dropping to the run's uid with no capabilities and no_new_privs
before the launcher starts as the namespace's PID 1. The run's output streams back as it comes.
Collecting stops every process of the run first, then tars the output directory from the host side.
A worker that goes away ends its run.

Each client is bounded: a slot (max_runs at once), a whole-HEAD deadline, a window of unread stdin
(execbox.sandbox.bwrap.wire), limits no higher than the policies' ceilings. A run's uid is taken
from other runs until the kernel shows no process holding it (its cgroup gone, no process in /proc
with the uid). Stopping the helper kills its runs and tells their workers; what a killed helper
left is swept at its next start.

The checks, the connection's slot and the run's uid are here; one run's life is in
execbox.sandbox.bwrap.running; the cgroup, the image trees, the seccomp program and the wire live
beside it.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from execbox.sandbox.bwrap import wire
from execbox.sandbox.bwrap.cgroups import sweep_leftovers
from execbox.sandbox.bwrap.checks import BadRun, BoundsError, checked, policy_bounds
from execbox.sandbox.bwrap.rootfs import Rootfs, RootfsError
from execbox.sandbox.bwrap.running import BWRAP, UMOUNT, RunningSandbox, uid_holders
from execbox.sandbox.bwrap.seccomp_bpf import compile_profile
from execbox.sandbox.seccomp import SeccompProfiles, narrowed
from execbox.sandbox.uids import parse_range

log = logging.getLogger(__name__)
HEAD_WAIT_S = 5.0
"""How long a new connection may take to send its whole HEAD, however it trickles in."""
PROGRAMS_KEPT = 16
RUNS_ROOT = Path("/run/execbox-bwrap")
"""Each helper keeps its runs' directories under RUNS_ROOT/<instance>, root-only (0700)."""
REAP_EVERY_S = 1.0
"""How often a run whose processes outlived its clean-up is tried again (its uid and slot held meanwhile)."""
STOP_WAIT_S = 5.0
"""How long a stopping helper waits for its runs' own clean-up before it sweeps what is left (well
within the 10 s a service manager or Docker gives a process to stop)."""


def _policies_dir() -> Path:
    return Path(os.environ.get("EXECBOX_POLICIES_DIR", "policies"))


@dataclass(frozen=True)
class HelperSettings:
    socket: Path
    group: str
    uid_range: str
    engine_url: str
    state: Path
    seccomp_profile: Path
    image_prefix: str = "execbox/sandbox-"
    oom_score_adj: int = 1000
    max_runs: int = 32
    """Runs at once; one more is refused (FAILED), not queued: a worker's own slots bound its runs."""
    policies: Path = field(default_factory=_policies_dir)
    """The deployment's policy files: no run may ask for more than their highest ceilings."""
    images: Path | None = None
    """Where unpacked images live (default `<state>/rootfs`); helpers on one host may share one."""


class Helper:
    def __init__(self, settings: HelperSettings) -> None:
        self.settings = settings
        self.oom_score_adj = settings.oom_score_adj
        self.uids = parse_range(settings.uid_range)
        self.bounds = policy_bounds(settings.policies)
        self.rootfs = Rootfs(settings.images or settings.state / "rootfs", settings.engine_url, settings.image_prefix)
        self.profiles = SeccompProfiles(settings.seccomp_profile)
        self._programs: dict[tuple[str, ...], bytes] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_runs)
        self._live_uids: set[int] = set()
        self._running: set[RunningSandbox] = set()
        self.stopping = False
        # Its own runs only, named after its state directory: another helper on the host (another
        # deployment's, or a test's) keeps its runs when this one starts or sweeps.
        self.instance = hashlib.sha256(str(Path(settings.state).resolve()).encode()).hexdigest()[:12]
        self.runs_dir = RUNS_ROOT / self.instance
        self.runs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        sweep(self.runs_dir, self.instance)

    def seccomp(self, deny: tuple[str, ...]) -> bytes:
        with self._lock:
            program = self._programs.get(deny)
        if program is None:  # compiled outside the lock; a few distinct narrowings at most are kept
            program = compile_profile(narrowed(self.profiles.base(), deny))
            with self._lock:
                if len(self._programs) >= PROGRAMS_KEPT:
                    self._programs.clear()
                self._programs[deny] = program
        return program

    def serve(self, conn: socket.socket) -> None:
        """One run, start to end; whatever happens, nothing of it is left on the host."""
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                conn.sendall(
                    wire.pack_json(wire.FAILED, {"error": f"the helper runs {self.settings.max_runs} already"})
                )
                conn.close()
            return
        uid: int | None = None
        try:
            frame = wire.read(conn, deadline=time.monotonic() + HEAD_WAIT_S)
            if frame is None or frame[0] != wire.HEAD:
                raise wire.WireError("the first frame must be HEAD")
            run = checked(wire.parse_json(frame[1], "HEAD"), self.uids, self.bounds)
            with self._lock:
                if self.stopping:
                    raise BadRun("the bubblewrap helper is stopping; retry")
                if run.uid in self._live_uids:
                    raise BadRun(f"uid: {run.uid} is another live run's")
                self._live_uids.add(run.uid)
                uid = run.uid
            rootfs = self.rootfs.path(run.image)
            sandbox = RunningSandbox(self, run, rootfs, conn, self.runs_dir, self.instance)
            with self._lock:
                if self.stopping:
                    raise BadRun("the bubblewrap helper is stopping; retry")
                self._running.add(sandbox)
        except (BadRun, RootfsError, wire.WireError, OSError) as exc:
            log.warning("refused a run: %s", exc)
            with contextlib.suppress(OSError):
                conn.sendall(wire.pack_json(wire.FAILED, {"error": str(exc)}))
                conn.close()
            self._done(uid)
            return
        try:
            free = sandbox.go()
        finally:
            with self._lock:
                self._running.discard(sandbox)
        if free:
            self._done(uid)
        else:
            self._hold(sandbox)

    def _done(self, uid: int | None) -> None:
        """The run's uid and slot go back (its run showed the uid free, or never started)."""
        with self._lock:
            if uid is not None:
                self._live_uids.discard(uid)
        self._slots.release()

    def _hold(self, sandbox: RunningSandbox) -> None:
        """A run whose processes did not all end: its uid and slot stay taken until they have."""
        log.warning("run %s: processes outlived its clean-up (uid %d held by %s); its uid stays taken until they end",
                    sandbox.token, sandbox.run.uid, uid_holders(sandbox.run.uid))  # fmt: skip
        while not sandbox.reap():
            time.sleep(REAP_EVERY_S)
        self._done(sandbox.run.uid)

    def stop(self) -> None:
        """Every live run is killed and its worker told why (a retryable fault, not the program's)."""
        with self._lock:
            self.stopping = True
            running = list(self._running)
        for sandbox in running:
            sandbox.abort("the bubblewrap helper stopped; the run was killed (retry)")
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    break
            time.sleep(0.05)
        # Whatever a clean-up has not finished yet (or a run still held), before the process ends.
        sweep(self.runs_dir, self.instance)


def sweep(runs_dir: Path, instance: str) -> None:
    """What this helper left when it stopped (or crashed): every run's processes killed, cgroup
    removed, workspace unmounted and deleted. At start, before any run of this helper exists."""
    if left := sweep_leftovers(f"{instance}."):
        log.warning("removed %d run cgroup(s) an earlier helper left", left)
    for run in runs_dir.iterdir():
        for mount in ("workspace", "shm"):
            subprocess.run([UMOUNT, "-l", str(run / mount)], check=False, capture_output=True)
        shutil.rmtree(run, ignore_errors=True)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    helper: Helper


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, _Server)
        self.server.helper.serve(self.request)


def main(settings: HelperSettings) -> None:
    if os.geteuid() != 0:
        raise SystemExit("execbox bwrap-helper: must run as root (it makes namespaces, cgroups and mounts)")
    for tool in (BWRAP, "/usr/bin/prlimit"):
        if not Path(tool).exists():
            raise SystemExit(f"execbox bwrap-helper: {tool} is missing (scripts/install installs it)")
    try:
        helper = Helper(settings)
    except BoundsError as exc:
        raise SystemExit(f"execbox bwrap-helper: {exc}") from exc
    settings.socket.parent.mkdir(parents=True, exist_ok=True)
    settings.socket.unlink(missing_ok=True)
    server = _Server(str(settings.socket), _Handler)
    server.helper = helper
    os.chown(
        settings.socket, 0, grp.getgrnam(settings.group).gr_gid if not settings.group.isdigit() else int(settings.group)
    )
    os.chmod(settings.socket, 0o660)
    log.info("bwrap helper listening on %s (group %s), bounds %s", settings.socket, settings.group, helper.bounds)

    def stop(signum: int, frame: FrameType | None) -> None:  # serve_forever returns once shutdown is asked
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        helper.stop()
        server.server_close()
        settings.socket.unlink(missing_ok=True)
