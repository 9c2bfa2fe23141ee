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

The checks, the spawn and the pumps of one run are here; the cgroup, the image trees, the seccomp
program and the wire live beside it.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import logging
import os
import queue
import secrets
import shutil
import socket
import socketserver
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from execbox.sandbox.bwrap import wire
from execbox.sandbox.bwrap.cgroups import RunCgroup, sweep_leftovers
from execbox.sandbox.bwrap.checks import BadRun, Run, checked
from execbox.sandbox.bwrap.collect import tar_output
from execbox.sandbox.bwrap.rootfs import Rootfs, RootfsError
from execbox.sandbox.bwrap.seccomp_bpf import compile_profile
from execbox.sandbox.seccomp import SeccompProfiles, narrowed
from execbox.sandbox.uids import parse_range

log = logging.getLogger(__name__)
BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
SHM_BYTES = 64 << 20
"""/dev/shm's size, as the Docker runtime's shm_size."""
MASKED_DIRS = ("/proc/acpi", "/proc/asound", "/proc/scsi", "/proc/bus")
MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts",
          "/proc/softirqs", "/proc/latency_stats", "/proc/sysrq-trigger")  # fmt: skip
STDIN_FRAMES = 64
"""stdin frames (up to 1 MiB each) held for a program that has not read them yet; past that the run ends."""
HEAD_WAIT_S = 10.0
"""How long a new connection may take to send its HEAD."""
PROGRAMS_KEPT = 16
MOUNT, UMOUNT, PRLIMIT, SH, ENV = "/usr/bin/mount", "/usr/bin/umount", "/usr/bin/prlimit", "/bin/sh", "/usr/bin/env"
BACKSTOP_S = 30.0
"""How long past its own timeout the helper lets a run go before it ends it itself."""
RUNS_ROOT = Path("/run/execbox-bwrap")
"""Each helper keeps its runs' directories under RUNS_ROOT/<instance>, root-only (0700)."""


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


class Helper:
    def __init__(self, settings: HelperSettings) -> None:
        self.settings = settings
        self.uids = parse_range(settings.uid_range)
        self.rootfs = Rootfs(settings.state, settings.engine_url, settings.image_prefix)
        self.profiles = SeccompProfiles(settings.seccomp_profile)
        self._programs: dict[tuple[str, ...], bytes] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_runs)
        self._live_uids: set[int] = set()
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
            return
        uid: int | None = None
        try:
            conn.settimeout(HEAD_WAIT_S)
            frame = wire.read(conn)
            if frame is None or frame[0] != wire.HEAD:
                raise wire.WireError("the first frame must be HEAD")
            run = checked(wire.parse_json(frame[1], "HEAD"), self.uids)
            with self._lock:
                if run.uid in self._live_uids:
                    raise BadRun(f"uid: {run.uid} is another live run's")
                self._live_uids.add(run.uid)
                uid = run.uid
            rootfs = self.rootfs.path(run.image)
        except (BadRun, RootfsError, wire.WireError, OSError) as exc:
            log.warning("refused a run: %s", exc)
            with contextlib.suppress(OSError):
                conn.sendall(wire.pack_json(wire.FAILED, {"error": str(exc)}))
            self._done(uid, conn)
            return
        try:
            RunningSandbox(self, run, rootfs, conn).go()
        finally:
            self._done(uid, conn)

    def _done(self, uid: int | None, conn: socket.socket) -> None:
        with self._lock:
            if uid is not None:
                self._live_uids.discard(uid)
        self._slots.release()
        with contextlib.suppress(OSError):
            conn.close()


def sweep(runs_dir: Path, instance: str) -> None:
    """What this helper left when it stopped (or crashed): every run's processes killed, cgroup
    removed, workspace unmounted and deleted. At start, before any run of this helper exists."""
    if left := sweep_leftovers(f"{instance}."):
        log.warning("removed %d run cgroup(s) an earlier helper left", left)
    for run in runs_dir.iterdir():
        subprocess.run([UMOUNT, "-l", str(run / "workspace")], check=False, capture_output=True)
        shutil.rmtree(run, ignore_errors=True)


class RunningSandbox:
    def __init__(self, helper: Helper, run: Run, rootfs: Path, conn: socket.socket) -> None:
        self.helper, self.run, self.rootfs, self.conn = helper, run, rootfs, conn
        self.token = secrets.token_hex(8)
        self.dir = helper.runs_dir / self.token
        self.workspace = self.dir / "workspace"
        self.send_lock = threading.Lock()
        self.cgroup: RunCgroup | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.mounted = False
        self.stdin: queue.Queue[bytes | None] = queue.Queue(maxsize=STDIN_FRAMES)

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.sendall(data)

    def go(self) -> None:
        try:
            self._prepare()
            self._spawn()
            self.send(wire.pack_json(wire.EXIT, {"event": "started"}))
            self._converse()
        except (OSError, wire.WireError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("run %s ended early: %s", self.token, exc)
            with contextlib.suppress(OSError):
                self.send(wire.pack_json(wire.FAILED, {"error": f"the bubblewrap helper failed: {exc}"}))
        finally:
            self._clean_up()

    def _prepare(self) -> None:
        run = self.run
        self.dir.mkdir(mode=0o700)
        self.workspace.mkdir()
        subprocess.run([MOUNT, "-t", "tmpfs", "-o", f"size={run.disk_mb}m,uid={run.uid},gid={run.uid},mode=0755,"
                        "nosuid,nodev", "tmpfs", str(self.workspace)], check=True, capture_output=True)  # fmt: skip
        self.mounted = True
        # The pids cgroup counts bubblewrap's own monitor and the launcher on top of the program's.
        name = f"{self.helper.instance}.{run.label}.{self.token}"
        self.cgroup = RunCgroup(name, run.memory_mb << 20, run.pids + 2, run.cpu)

    def _argv(self, seccomp_fd: int) -> list[str]:
        run, cgroup = self.run, self.cgroup
        assert cgroup is not None
        argv = [BWRAP, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
                # setpriv needs these three to drop to the run's uid; nothing else reaches it.
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
                "--ro-bind", str(self.rootfs), "/", "--bind", str(self.workspace), "/workspace",
                "--perms", "1777", "--size", str(run.disk_mb << 20), "--tmpfs", "/tmp",
                "--dev", "/dev", "--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
                "--proc", "/proc", "--tmpfs", "/sys",
                # Only the run's own memory cgroup, where the launcher reads its OOM count and peak.
                "--perms", "0755", "--dir", "/sys/fs", "--perms", "0755", "--dir", "/sys/fs/cgroup",
                "--ro-bind", str(cgroup.memory_dir), "/sys/fs/cgroup" if cgroup.v2 else "/sys/fs/cgroup/memory",
                "--remount-ro", "/sys", "--chdir", "/workspace", "--clearenv"]  # fmt: skip
        for path in MASKED:
            if os.path.isfile(path):  # what this kernel's /proc has: a sandbox's shows the same files
                argv += ["--ro-bind", "/dev/null", path]
        for path in MASKED_DIRS:
            if os.path.isdir(path):
                argv += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        # The run's environment reaches only the launcher, after the drop: bubblewrap and setpriv
        # (root, with the three capabilities) run with PATH alone.
        argv += ["--setenv", "PATH", "/usr/bin:/bin"]
        drop = [SETPRIV, f"--reuid={run.uid}", f"--regid={run.uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]  # fmt: skip
        environ = [f"{name}={value}" for name, value in run.env]
        argv += ["--seccomp", str(seccomp_fd), "--", *drop, ENV, "-i", *environ, *run.command]
        return argv

    def _spawn(self) -> None:
        run, cgroup = self.run, self.cgroup
        assert cgroup is not None
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, self.helper.seccomp(run.seccomp_deny))  # a few KiB: within a pipe's buffer
            os.close(write_end)
            write_end = -1
            limits = [f"--cpu={run.cpu_time_s}:{run.cpu_time_s + 1}", "--nofile=1024", f"--fsize={run.disk_mb << 20}",
                      "--core=0", f"--stack={8 << 20}", f"--nproc={run.pids + 1}"]  # fmt: skip
            # The shell joins the run's cgroup(s) before bubblewrap exists, so nothing of the run is
            # ever outside them; prlimit sets the per-process limits Docker sets as ulimits.
            # The host's OOM killer picks a sandbox before any service (as oom_score_adj does for containers).
            joins = ('echo "$EBX_OOM" > /proc/self/oom_score_adj && '
                     'for f in $EBX_CGROUPS; do echo $$ > "$f" || exit 121; done; exec "$@"')  # fmt: skip
            self.process = subprocess.Popen(
                [SH, "-c", joins, "sh", PRLIMIT, *limits, "--", *self._argv(read_end)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_end,),
                env={"EBX_CGROUPS": " ".join(cgroup.procs_files), "EBX_OOM": str(self.helper.settings.oom_score_adj),
                     "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)

    def _pump(self, source: IO[bytes], kind: int) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.read1(1 << 16):  # type: ignore[attr-defined]
                self.send(wire.pack(kind, chunk))

    def _converse(self) -> None:
        process = self.process
        assert process is not None and process.stdout is not None and process.stderr is not None
        pumps = [threading.Thread(target=self._pump, args=(s, k), daemon=True)
                 for s, k in ((process.stdout, wire.OUT), (process.stderr, wire.ERR))]  # fmt: skip
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._report_exit, args=(pumps,), daemon=True).start()
        threading.Thread(target=self._feed, daemon=True).start()
        # Whatever the worker does (or does not), the run ends this long after its timeout.
        deadline = threading.Timer(self.run.timeout_s + BACKSTOP_S, self._expire)
        deadline.daemon = True
        deadline.start()
        self.conn.settimeout(None)
        try:
            while (frame := wire.read(self.conn)) is not None:
                kind, payload = frame
                if kind in (wire.STDIN, wire.STDIN_END):
                    try:
                        self.stdin.put_nowait(payload if kind == wire.STDIN else None)
                    except queue.Full:
                        raise wire.WireError("more stdin than the program reads") from None
                elif kind == wire.KILL:
                    self._kill()
                elif kind == wire.COLLECT:
                    self._kill()
                    self._collect()
                elif kind == wire.RELEASE:
                    return
                else:
                    raise wire.WireError(f"unexpected frame kind {kind}")
        finally:
            deadline.cancel()
            with contextlib.suppress(queue.Full):
                self.stdin.put_nowait(None)  # the feeder ends (a full queue: it ends with the program)

    def _expire(self) -> None:
        log.warning("run %s of %s passed its timeout by %.0f s: ended by the helper", self.token, self.run.label,
                    BACKSTOP_S)  # fmt: skip
        with contextlib.suppress(RuntimeError):
            self._kill()
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)

    def _feed(self) -> None:
        """The program's stdin, written from a thread of its own: a program that never reads blocks
        only this thread, never the conversation (KILL, COLLECT, the end of the connection)."""
        stdin = self.process.stdin if self.process else None
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):  # the program ended, or closed its stdin
            while (data := self.stdin.get()) is not None:
                stdin.write(data)
                stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def _report_exit(self, pumps: list[threading.Thread]) -> None:
        process = self.process
        assert process is not None
        status = process.wait()
        for pump in pumps:
            pump.join()
        log.info("run %s of %s (uid %d) ended with status %s", self.token, self.run.label, self.run.uid, status)
        with contextlib.suppress(OSError):
            self.send(wire.pack_json(wire.EXIT, {"event": "exited", "status": status}))

    def _kill(self) -> None:
        if self.cgroup is not None and not self.cgroup.kill():
            raise RuntimeError("the run's processes did not end within 10 s of SIGKILL")

    def _collect(self) -> None:
        """The output directory as TAR frames, read once every process of the run is gone."""
        error = tar_output(self.workspace, self.run.collect, self.run.disk_mb << 20,
                           lambda data: self.send(wire.pack(wire.TAR, data)))  # fmt: skip
        self.send(wire.pack_json(wire.TAR_END, {"error": error}))

    def _clean_up(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._kill()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.mounted:
            subprocess.run([UMOUNT, "-l", str(self.workspace)], check=False, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.conn.close()


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
    helper = Helper(settings)
    settings.socket.parent.mkdir(parents=True, exist_ok=True)
    settings.socket.unlink(missing_ok=True)
    server = _Server(str(settings.socket), _Handler)
    server.helper = helper
    os.chown(
        settings.socket, 0, grp.getgrnam(settings.group).gr_gid if not settings.group.isdigit() else int(settings.group)
    )
    os.chmod(settings.socket, 0o660)
    log.info("bwrap helper listening on %s (group %s)", settings.socket, settings.group)
    server.serve_forever()
