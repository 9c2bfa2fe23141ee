"""A session's processes, started on request (`proc.*`).

Processes run as the sandbox's user, each in a session of its own (its pid is its session id), with
the session's environment plus the request's. They are not a cell's leftovers: the sweep after
each cell spares every process of such a session (see `spared`). A kernel restart (kill -1) ends
them with everything else, and each reports its end.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import os
import signal
import struct
import termios
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import session_paths as paths
from session_paths import Emit, Json, Opened, OpError, clean

MAX_PROCS = 32
MAX_INPUT = 1 << 20
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGHUP": signal.SIGHUP}


class Process:
    def __init__(self, pid: int, request: Json, stdin: int | None, pipes: dict[int, int]) -> None:
        self.pid, self.stdin, self.pipes = pid, stdin, pipes
        self.pty = 3 in pipes.values()
        self.info = {"pid": pid, "tag": request.get("tag"), "argv": request["argv"], "env": request.get("env") or {},
                     "cwd": request.get("cwd") or paths.WORKDIR}  # fmt: skip
        timeout = request.get("timeout_s")
        self.deadline: float | None = (
            time.monotonic() + timeout if isinstance(timeout, (int, float)) and timeout > 0 else None
        )


def _child(
    argv: list[str], environ: dict[str, str], cwd: str, stdio: Sequence[int], terminal: int | None = None
) -> NoReturn:
    """In a forked child: a session of its own (with `terminal` as its controlling one), stdio on the
    three fds given, nothing else open, then the program; never returns."""
    try:
        os.setsid()
        if terminal is not None:
            fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)
        for fd, target in zip(stdio, (0, 1, 2), strict=False):
            os.dup2(fd, target)
        os.closerange(3, 1024)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(cwd)
        os.execvpe(argv[0], argv, environ)
    except OSError as exc:
        os.write(2, (f"{argv[0]}: {exc.strerror}\n").encode())
    finally:
        os._exit(127)


def _fork() -> int:
    """os.fork, its failure an answer (the sandbox's process limit reached, say by a fork bomb)."""
    try:
        return os.fork()
    except OSError as exc:
        raise OpError("failed", f"no process could be started ({exc.strerror}): the sandbox's process limit is "
                      "reached; end some processes (proc.signal) and retry") from None  # fmt: skip


def pids() -> list[int]:
    """Every process in the sandbox (its pid namespace)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _members(sid: int) -> list[int]:
    """The live (not zombie) processes of session sid."""
    found: list[int] = []
    for pid in pids():
        seen = proc_stat(pid)
        if seen is not None and seen[1] == sid and seen[0] != "Z":
            found.append(pid)
    return found


def _signal_session(sid: int, sig: int) -> None:
    """Signal every process of a command's session (its process group is not enough: what it
    started may have made groups of its own). SIGKILL is repeated until none is left (one may
    fork while the others are killed); each is stopped first so that none forks past the kill."""
    if sig != signal.SIGKILL:
        for pid in _members(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return
    for attempt in range(100):
        members = _members(sid)
        if not members:
            return
        if attempt:
            time.sleep(0.002)  # the killed ones are still exiting
        for stop in (signal.SIGSTOP, signal.SIGKILL):
            for pid in members:
                try:
                    os.kill(pid, stop)
                except ProcessLookupError:
                    pass


def _size(request: Any) -> tuple[int, int]:
    """A terminal's (rows, cols) from {"rows", "cols"}."""
    size: Any = request or {}
    rows, cols = size.get("rows"), size.get("cols")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096 for n in (rows, cols)):
        raise OpError("invalid", "a terminal's size is rows and cols from 1 to 4096")
    return rows, cols


class Processes:
    """The processes started on request, and their pipes."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.live: dict[int, Process] = {}
        self.ended: dict[int, Process] = {}
        """Processes whose leader has ended, by session id, while any member of the session is left:
        spared by the cell sweep, listed, signalable, and killed at the command's lifetime."""

    def watched(self) -> list[int]:
        return [fd for proc in self.live.values() for fd in proc.pipes]

    def spared(self, sids: set[int]) -> set[int]:
        """The session ids the cell sweep must leave alone, given the sids of the processes alive."""
        for sid in list(self.ended):
            if sid not in sids:
                del self.ended[sid]
        return set(self.live) | set(self.ended)

    def _left(self) -> None:
        """Forget the ended commands whose sessions have no process left."""
        for sid in list(self.ended):
            if not _members(sid):
                del self.ended[sid]

    def handle(self, request: Json) -> Json:
        op = request.get("op")
        if op == "proc.list":
            self._left()
            left = [dict(proc.info, leader_ended=True) for proc in self.ended.values()]
            return {"processes": [proc.info for proc in self.live.values()] + left}
        if op == "proc.start":
            return self._start(request)
        pid: Any = request.get("pid")
        proc = self.live.get(pid)
        if proc is None and op == "proc.signal" and request.get("pid") in self.ended:
            if _members(request["pid"]):  # what its leader left running: still the command's
                proc = self.ended[request["pid"]]
            else:
                del self.ended[request["pid"]]
        if proc is None:
            raise OpError("not_found", "no running process {!r}".format(request.get("pid")))
        if op == "proc.signal":
            name: Any = request.get("sig")
            sig = SIGNALS.get(name)
            if sig is None:
                raise OpError("invalid", "signal must be one of {}".format(", ".join(SIGNALS)))
            _signal_session(proc.pid, sig)
            return {}
        if op == "proc.input":
            if proc.stdin is None:
                raise OpError("invalid", f"process {proc.pid} was started without stdin")
            try:
                data = base64.b64decode(request.get("b") or "", validate=True)
            except ValueError:
                raise OpError("invalid", "the input is not base64") from None
            if len(data) > MAX_INPUT:
                raise OpError("too_large", f"at most {MAX_INPUT} bytes of input at a time")
            written: int | None
            try:
                written = os.write(proc.stdin, data) if data else 0
            except (BlockingIOError, BrokenPipeError):
                written = 0 if data else None
            if data and written != len(data):
                raise OpError(
                    "failed", f"process {proc.pid} is not reading its stdin ({written or 0} of {len(data)} bytes taken)"
                )
            return {}
        if op == "proc.resize":
            if not proc.pty:
                raise OpError("invalid", f"process {proc.pid} has no pseudo-terminal")
            rows, cols = _size(request)
            assert proc.stdin is not None, "a terminal's one fd"
            fcntl.ioctl(proc.stdin, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            return {}
        if op == "proc.close":
            if proc.pty:  # its input and output are one fd: closing it would hang the terminal up
                return {}
            if proc.stdin is not None:
                os.close(proc.stdin)
                proc.stdin = None
            return {}
        raise OpError("invalid", f"unknown op {op!r}")

    def _start(self, request: Json) -> Json:
        argv, env, cwd = request.get("argv"), request.get("env") or {}, request.get("cwd") or paths.WORKDIR
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise OpError("invalid", "argv must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise OpError("invalid", "env must map names to strings")
        if len(self.live) >= MAX_PROCS:
            raise OpError("too_large", f"at most {MAX_PROCS} processes run at once in a sandbox")
        cwd = clean(cwd)
        with Opened(cwd, os.O_PATH | os.O_DIRECTORY, False):
            pass  # it exists, is a directory, and is not hidden
        environ = {**os.environ, **env, "PWD": cwd}  # the shell's pwd says the directory as it was asked
        if request.get("pty") is not None:
            return self._start_pty(request, argv, environ, cwd)
        stdin_r, stdin_w = os.pipe() if request.get("stdin") else (os.open(os.devnull, os.O_RDONLY), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = _fork()
        except OpError:
            for fd in (stdin_r, out_w, err_w, out_r, err_r, stdin_w):
                if fd is not None:
                    os.close(fd)
            raise
        if pid == 0:
            _child(argv, environ, cwd, (stdin_r, out_w, err_w))
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        for fd in (out_r, err_r) + ((stdin_w,) if stdin_w is not None else ()):
            os.set_inheritable(fd, False)
            os.set_blocking(fd, False)
        self.live[pid] = Process(pid, request, stdin_w, {out_r: 1, err_r: 2})
        return {"pid": pid}

    def _start_pty(self, request: Json, argv: list[str], environ: dict[str, str], cwd: str) -> Json:
        """A process on a pseudo-terminal of its own (its controlling terminal): what it writes comes
        back as fd 3, what is sent to it is typed."""
        rows, cols = _size(request.get("pty"))
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        try:
            pid = _fork()
        except OpError:
            os.close(master)
            os.close(slave)
            raise
        if pid == 0:
            _child(argv, environ, cwd, (slave, slave, slave), terminal=slave)
        os.close(slave)
        os.set_inheritable(master, False)
        os.set_blocking(master, False)
        self.live[pid] = Process(pid, request, master, {master: 3})
        return {"pid": pid}

    def expire(self) -> None:
        """Kill the commands whose lifetime is over, and everything in their sessions (what they
        started in the background included, whether their leader has ended or not); an end is
        reported when its leader is reaped."""
        now = time.monotonic()
        for proc in [*self.live.values(), *self.ended.values()]:
            if proc.deadline is not None and now >= proc.deadline:
                proc.deadline = None
                _signal_session(proc.pid, signal.SIGKILL)

    def timed(self) -> bool:
        """Whether any command still has a lifetime to enforce (the supervisor calls expire then)."""
        return bool(self.live) or any(proc.deadline is not None for proc in self.ended.values())

    def readable(self, fd: int) -> bool:
        """Forward what a process wrote on fd; False when fd is none of theirs."""
        for proc in self.live.values():
            if fd in proc.pipes:
                self._forward(proc, fd)
                return True
        return False

    def _forward(self, proc: Process, fd: int) -> None:
        try:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError as exc:  # a terminal whose process is gone says EIO, not end of file
                    if exc.errno != errno.EIO:
                        raise
                    data = b""
                if not data:
                    del proc.pipes[fd]
                    os.close(fd)
                    if proc.stdin == fd:
                        proc.stdin = None
                    return
                self.emit({"ev": "pout", "pid": proc.pid, "fd": proc.pipes[fd], "b": base64.b64encode(data).decode()})
        except BlockingIOError:
            return

    def reaped(self, pid: int, status: int) -> bool:
        """A child ended; True when it was one of ours (its end is reported)."""
        proc = self.live.pop(pid, None)
        if proc is None:
            return False
        for fd in list(proc.pipes):
            self._forward(proc, fd)
            if fd in proc.pipes:
                os.close(fd)
                if proc.stdin == fd:  # a terminal: one fd both ways
                    proc.stdin = None
        if proc.stdin is not None:
            os.close(proc.stdin)
        self.ended[pid] = proc
        code = os.waitstatus_to_exitcode(status)
        self.emit({"ev": "pend", "pid": pid, "status": code if code >= 0 else 128 - code,
                   "signal": signal.Signals(-code).name if code < 0 else None})  # fmt: skip
        return True
