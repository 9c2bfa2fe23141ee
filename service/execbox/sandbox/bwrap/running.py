"""One run of the bubblewrap helper, start to end: its workspace and /dev/shm, its cgroup, the spawn
(every process of the run is in the run's cgroups before bubblewrap exists, read back from the
kernel before the run is reported started), the conversation with the worker, and the clean-up
that says whether the run's uid may be given to another run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Protocol

from execbox.sandbox.bwrap import wire
from execbox.sandbox.bwrap.cgroups import RunCgroup
from execbox.sandbox.bwrap.checks import Run
from execbox.sandbox.bwrap.collect import tar_output

log = logging.getLogger(__name__)
BWRAP = "/usr/bin/bwrap"
SETPRIV = "/usr/bin/setpriv"
MOUNT, UMOUNT, PRLIMIT, SH, ENV = "/usr/bin/mount", "/usr/bin/umount", "/usr/bin/prlimit", "/bin/sh", "/usr/bin/env"
SHM_BYTES = 64 << 20
"""/dev/shm's size, as the Docker runtime's shm_size."""
MASKED_DIRS = ("/proc/acpi", "/proc/asound", "/proc/scsi", "/proc/bus")
MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts",
          "/proc/softirqs", "/proc/latency_stats", "/proc/sysrq-trigger")  # fmt: skip
BACKSTOP_S = 30.0
"""How long past its own timeout the helper lets a run go before it ends it itself."""
JOIN_WAIT_S = 60.0
"""How long the spawned shell may take to join the run's cgroups (a host writing back a freshly
unpacked image stalled it past 10 s; the worker waits START_WAIT_S for a start)."""
JOIN_POLL_S = 0.001
STARTED = wire.pack_json(wire.EXIT, {"event": "started"})


class Host(Protocol):
    """What a run needs of its helper."""

    oom_score_adj: int

    def seccomp(self, deny: tuple[str, ...]) -> bytes: ...


class RunningSandbox:
    def __init__(self, host: Host, run: Run, rootfs: Path, conn: socket.socket, runs_dir: Path, instance: str) -> None:
        self.host, self.run, self.rootfs, self.conn = host, run, rootfs, conn
        self.token = secrets.token_hex(8)
        self.name = f"{instance}.{run.label}.{self.token}"
        self.dir = runs_dir / self.token
        self.workspace = self.dir / "workspace"
        self.shm = self.dir / "shm"
        self.send_lock = threading.Lock()
        self.cgroup: RunCgroup | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.mounts: list[Path] = []
        self.stdin: queue.Queue[bytes | None] = queue.Queue()
        self.stdin_held = 0
        """STDIN bytes taken from the worker and not yet written (at most wire.STDIN_WINDOW)."""
        self.stdin_lock = threading.Lock()
        self.uid_free = False

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.sendall(data)

    def go(self) -> bool:
        """The run, start to end; True when its uid is free (every process of it is gone)."""
        try:
            self._prepare()
            self._spawn()
            self.send(STARTED)
            self._converse()
        except (OSError, wire.WireError, RuntimeError, subprocess.SubprocessError) as exc:
            log.warning("run %s ended early: %s", self.token, exc)
            self.fail(f"the bubblewrap helper failed: {exc}")
        finally:
            self.uid_free = self._stop()
            with contextlib.suppress(OSError):
                self.send(wire.pack_json(wire.EXIT, {"event": "released", "uid_free": self.uid_free}))
            with contextlib.suppress(OSError):
                self.conn.close()
            for mount in self.mounts:  # after the worker was told: nothing of the run runs any more
                subprocess.run([UMOUNT, "-l", str(mount)], check=False, capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
        return self.uid_free

    def fail(self, error: str) -> None:
        with contextlib.suppress(OSError):
            self.send(wire.pack_json(wire.FAILED, {"error": error}))

    def abort(self, error: str) -> None:
        """From another thread (the helper stopping): the worker is told why, every process of the run
        is killed, and the conversation ends."""
        self.fail(error)
        with contextlib.suppress(RuntimeError):
            self._kill()
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RD)

    def _mount_tmpfs(self, target: Path, options: str) -> None:
        target.mkdir()
        subprocess.run([MOUNT, "-t", "tmpfs", "-o", options, "tmpfs", str(target)], check=True, capture_output=True)
        self.mounts.append(target)

    def _prepare(self) -> None:
        run = self.run
        self.dir.mkdir(mode=0o700)
        self._mount_tmpfs(self.workspace, f"size={run.disk_mb}m,uid={run.uid},gid={run.uid},mode=0755,nosuid,nodev")
        # bubblewrap's --tmpfs takes no options: /dev/shm is this mount, bound in (noexec stays with it).
        self._mount_tmpfs(self.shm, f"size={SHM_BYTES},mode=1777,nosuid,nodev,noexec")
        # The pids cgroup counts bubblewrap's own monitor and the launcher on top of the program's.
        self.cgroup = RunCgroup(self.name, run.memory_mb << 20, run.pids + 2, run.cpu)

    def _argv(self, seccomp_fd: int) -> list[str]:
        run, cgroup = self.run, self.cgroup
        assert cgroup is not None
        argv = [BWRAP, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
                # setpriv needs these three to drop to the run's uid; nothing else reaches it.
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
                "--ro-bind", str(self.rootfs), "/", "--bind", str(self.workspace), "/workspace",
                "--perms", "1777", "--size", str(run.disk_mb << 20), "--tmpfs", "/tmp",
                "--dev", "/dev", "--bind", str(self.shm), "/dev/shm",
                # setpriv runs as uid 0 until it drops: /proc/sys (core_pattern) must not be writable then.
                # The kernel answers /proc/sys after the reader's namespaces, whichever proc it is bound from.
                "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--tmpfs", "/sys",
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
            os.write(write_end, self.host.seccomp(run.seccomp_deny))  # a few KiB: within a pipe's buffer
            os.close(write_end)
            write_end = -1
            limits = [f"--cpu={run.cpu_time_s}:{run.cpu_time_s + 1}", "--nofile=1024", f"--fsize={run.disk_mb << 20}",
                      "--core=0", f"--stack={8 << 20}", f"--nproc={run.pids + 1}"]  # fmt: skip
            # The shell joins the run's cgroup(s) before bubblewrap exists, so nothing of the run is
            # ever outside them; prlimit sets the per-process limits Docker sets as ulimits. The
            # host's OOM killer picks a sandbox before any service (as oom_score_adj does for containers).
            joins = ('echo "$EBX_OOM" > /proc/self/oom_score_adj && '
                     'for f in $EBX_CGROUPS; do echo $$ > "$f" || exit 121; done; exec "$@"')  # fmt: skip
            self.process = subprocess.Popen(
                [SH, "-c", joins, "sh", PRLIMIT, *limits, "--", *self._argv(read_end)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(read_end,),
                env={"EBX_CGROUPS": " ".join(cgroup.procs_files), "EBX_OOM": str(self.host.oom_score_adj),
                     "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=True,
            )  # fmt: skip
        finally:
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        # Nothing of the conversation (a RELEASE sent with the HEAD, say) is read before the kernel
        # shows the run's first process in every one of its cgroups: a kill then reaches all of it.
        # (The kernel sends no event for a join; the shell takes about a millisecond.)
        deadline = time.monotonic() + JOIN_WAIT_S
        while not cgroup.holds(self.process.pid):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the run's first process could not join its cgroups (status {self.process.returncode})"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the run's first process did not join its cgroups within {JOIN_WAIT_S:.0f} s")
            time.sleep(JOIN_POLL_S)

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
                    self._take_stdin(payload if kind == wire.STDIN else None)
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
            self.stdin.put(None)  # the feeder ends

    def _take_stdin(self, data: bytes | None) -> None:
        with self.stdin_lock:
            if data is not None and self.stdin_held + len(data) > wire.STDIN_WINDOW:
                raise wire.WireError(f"stdin past the {wire.STDIN_WINDOW}-byte window the helper granted")
            self.stdin_held += len(data or b"")
        self.stdin.put(data)

    def _expire(self) -> None:
        log.warning("run %s of %s passed its timeout by %.0f s: ended by the helper", self.token, self.run.label,
                    BACKSTOP_S)  # fmt: skip
        with contextlib.suppress(RuntimeError):
            self._kill()
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)

    def _feed(self) -> None:
        """The program's stdin, written from a thread of its own: a program that never reads blocks
        only this thread, never the conversation (KILL, COLLECT, the end of the connection). Each
        piece written is credited back to the worker, which sends no more than the window."""
        stdin = self.process.stdin if self.process else None
        if stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):  # the program ended, or closed its stdin
            while (data := self.stdin.get()) is not None:
                stdin.write(data)
                stdin.flush()
                with self.stdin_lock:
                    self.stdin_held -= len(data)
                self.send(wire.pack_credit(len(data)))
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def _report_exit(self, pumps: list[threading.Thread]) -> None:
        process, cgroup = self.process, self.cgroup
        assert process is not None and cgroup is not None
        status = process.wait()
        for pump in pumps:
            pump.join()
        # The launcher killed by the OOM killer reports nothing itself: the run's memory limit did it.
        oom_kills = cgroup.oom_kills()
        log.info("run %s of %s (uid %d) ended with status %s (OOM kills: %d)", self.token, self.run.label, self.run.uid,
                 status, oom_kills)  # fmt: skip
        with contextlib.suppress(OSError):
            self.send(wire.pack_json(wire.EXIT, {"event": "exited", "status": status, "oom_kills": oom_kills}))

    def _kill(self) -> None:
        if self.cgroup is not None and not self.cgroup.kill():
            raise RuntimeError("the run's processes did not end within 10 s of SIGKILL")

    def _collect(self) -> None:
        """The output directory as TAR frames, read once every process of the run is gone."""
        ended = tar_output(self.workspace, self.run.collect, self.run.disk_mb << 20,
                           lambda data: self.send(wire.pack(wire.TAR, data)))  # fmt: skip
        self.send(wire.pack_json(wire.TAR_END, {"error": ended.error, "cut": ended.cut}))

    def _stop(self) -> bool:
        """Every process of the run ended; True when its uid is free (see reap)."""
        with contextlib.suppress(RuntimeError):
            self._kill()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        return self.reap()

    def reap(self) -> bool:
        """Kill what is left of the run and remove its cgroup; True once the cgroup is gone and the
        kernel shows no process holding the run's uid."""
        if self.cgroup is not None:
            with contextlib.suppress(RuntimeError):
                self._kill()
            if not self.cgroup.remove():
                return False
        elif self.process is not None and self.process.poll() is None:
            return False
        return not uid_holders(self.run.uid)


def uid_holders(uid: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids of every live process whose real, effective, saved or file-system uid is `uid` (a
    zombie runs nothing and holds nothing but its pid until its parent reaps it)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            with open(entry / "status", "rb") as status:
                for line in status:
                    if line.startswith(b"State:") and line.split()[1:2] == [b"Z"]:
                        break
                    if line.startswith(b"Uid:"):
                        if uid in (int(u) for u in line.split()[1:]):
                            found.append(int(entry.name))
                        break
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return found
