"""execbox session supervisor: the program a session's sandbox runs, as its PID 1.

It keeps one kernel process (kernel.py, an IPython interpreter) and relays between it and the
worker. The worker writes requests on stdin, one JSON object per line:

    {"op": "run", "id": ..., "code": ..., "env": {...}, "context": ...}   run a cell (one at a time;
                                                          the context is the kernel's: kernel.py)
    {"op": "interrupt", "id": ...}                        the worker's clock ran out for that cell

and reads events on stdout, one JSON object per line, and nothing else ever goes there:

    {"ev": "ready", "restarted": false}                  the kernel waits for a cell
    {"ev": "out", "fd": 1 or 2, "b": base64}              the running cell's stdout / stderr
    {"ev": "end", "id": ..., "status": n, "changed": [...], "restarted": bool, "oom": bool,
     "peak": bytes, "reason": text or null}

A call's end is the supervisor's to report, and it reports it only once nothing of the cell runs
any more. The kernel answers each cell from a process it is about to leave: it forks, the copy (one
thread, every variable) waits for the next request, and the old process reports the copy's pid and
exits, taking with it every thread the cell left (one reading fd 0 for the next call's request, or
writing a made-up end on fd 3). The supervisor then waits for that exit, checks the copy (its child,
as this process is init; one thread), kills every other process in the sandbox (what the cell
started and left), and only then writes `end`. A report that does not lead there (no exit,
a pid that is not a fresh single-threaded child) restarts the kernel instead.

An interrupt (the worker's clock ran out, a cancel, the output cap) is SIGINT to the kernel's
process group. A cell that stops hands over as above (its variables kept, nothing of it left
running); one that has not handed over GRACE_S later is not waited for: the kernel is restarted,
so a cell past its timeout never lives into the next call. Restarting kills every process in the
sandbox but this one (kill -1, which no fork outruns) and starts a fresh kernel
(`restarted`: variables are gone, the workspace stays). A kernel that dies during a cell (the
program exited the process, the OOM killer) is restarted the same way, and the cell's end says so.
When stdin closes (the worker let go of the session) the supervisor ends, and the sandbox with it.

The launcher execs this program in its own place, so it is the sandbox's init: the kernel drops
every signal sent to a PID namespace's init from inside it unless init handles that signal, and
SIGSTOP and SIGKILL always. This process handles none (SIGINT is set back to the default, which for
init means ignored), so no signal of the code it supervises, which runs as the same uid, reaches
it: a cell cannot stop it and so make the worker wait on a channel nobody reads.

This process is not dumpable (no ptrace, no /proc/<pid>/fd, no memory reads by the program, which
runs as the same uid), and the kernel never holds its fds: the worker's channel (this stdin and
stdout) is out of the program's reach. What a cell can still do is what any cell of a notebook can:
change the interpreter the later cells of its own session run in (a cell that replaces the
kernel's loop runs on as that loop). A caller that hands a later call a secret runs no untrusted
code in that session before it. The worker keeps its own clock and caps.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import select
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import session_ops
from launch import cgroup_figure  # the launcher's reader of the memory cgroup
from session_paths import Json
from session_processes import pids, proc_stat

KERNEL = ("python3", "/opt/execbox/kernel.py")
CONTEXT_SCRIPT = b"/opt/execbox/js_context.js"
"""The program of the only processes the kernel keeps beside itself (kernel.py's Script)."""
GRACE_S = 2.0
HANDOVER_S = 5.0
"""How long the kernel's old process may take to exit once it reported a cell's end."""
READY_TIMEOUT_S = 60.0
SWEEP_S = 1.0
"""Between cells, how often the processes that belong to no command (nor the kernel) are killed."""
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def _emit(event: Json) -> None:
    data = (json.dumps(event) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


class Kernel:
    """The kernel process and the supervisor's ends of its four pipes."""

    def __init__(self) -> None:
        to_kernel, self.ctl = os.pipe()
        self.out, out_w = os.pipe()
        self.err, err_w = os.pipe()
        self.rep, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setsid()  # its own process group: an interrupt or a kill reaches all it started
                for fd, target in ((to_kernel, 0), (out_w, 1), (err_w, 2), (rep_w, 3)):
                    os.dup2(fd, target)
                os.closerange(4, 1024)
                os.execvp(KERNEL[0], KERNEL)
            finally:
                os._exit(127)
        for fd in (to_kernel, out_w, err_w, rep_w):
            os.close(fd)
        self.group = self.pid
        """The kernel's process group: its first process's pid, kept by every copy it hands over to."""
        self.buffer = b""
        self.alive = True
        self.status = 0
        """The wait status of an ended kernel process."""
        self.helpers: set[int] = set()
        """Processes the kernel keeps beside itself (a JavaScript context's node): spared by the sweep."""
        self.closed: set[int] = set()
        """Pipes the kernel closed (a program may close its own stdout): no longer watched."""

    def watched(self) -> list[int]:
        return [fd for fd in (self.rep, self.out, self.err) if fd not in self.closed]

    def send(self, request: Json) -> None:
        data = (json.dumps(request) + "\n").encode()
        while data:
            data = data[os.write(self.ctl, data) :]

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.group, sig)
        except ProcessLookupError:
            pass

    def hand_over(self, report: Json) -> bool:
        """Follow the kernel to the copy it reported (see kernel.py); False when that did not happen
        as it must: the old process gone, the copy our child, alone in its process."""
        copy = report.get("kernel")
        deadline = time.monotonic() + HANDOVER_S
        while self.exited() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        if not isinstance(copy, int) or copy <= 1 or copy == os.getpid():
            return False
        fields = _status(copy)
        if fields.get("PPid") != str(os.getpid()) or fields.get("Tgid") != str(copy) or fields.get("Threads") != "1":
            return False
        self.pid, self.alive = copy, True
        return True

    def sweep(self) -> None:
        """Kill every process in the sandbox but this one (PID 1) and the kernel: what a cell
        started and left running. Repeated until none is left (one may fork while it is killed)."""
        # A command just forked may not have made its own session yet (setsid): spared by its pid.
        keep = {1, os.getpid(), self.pid, *self.helpers, *OPS.processes.live}
        for _ in range(100):
            sids = {pid: _sid(pid) for pid in pids() if pid not in keep}
            spared = OPS.processes.spared(set(sids.values()))
            others = [pid for pid, sid in sids.items() if sid not in spared]
            if not others:
                break
            for pid in others:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap(self)
        _reap(self)

    def exited(self, block: bool = False) -> int | None:
        """The kernel's wait status once it has ended (reaped), else None."""
        if not self.alive:
            return self.status
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return None
        self.alive, self.status = False, status
        return status

    def close(self) -> None:
        """Kill the kernel and everything else in the sandbox (kill -1 spares only this process,
        and no process can fork past it)."""
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.exited(block=True)
        deadline = time.monotonic() + 5.0
        while any(pid not in (1, os.getpid()) for pid in pids()) and time.monotonic() < deadline:
            _reap(self)
            time.sleep(0.005)
        _reap(self)
        for fd in (self.ctl, self.out, self.err, self.rep):
            try:
                os.close(fd)
            except OSError:
                pass


def _sid(pid: int) -> int:
    """A process's session id (0 when it is gone)."""
    seen = proc_stat(pid)
    return 0 if seen is None else seen[1]


def _is_context(pid: int) -> bool:
    """Whether pid runs a JavaScript context (what the kernel may ask the sweep to spare)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return CONTEXT_SCRIPT in f.read().split(b"\0")
    except OSError:
        return False


def _status(pid: int) -> dict[str, str]:
    """A process's /proc status fields (Name: value), {} when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {}


def _reap(kernel: Kernel) -> None:
    """Collect every ended child (this process is init: orphans of a cell end up here); the
    kernel's own end is noted, not lost."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == kernel.pid and kernel.alive:
            kernel.alive, kernel.status = False, status
        else:
            OPS.processes.reaped(pid, status)


def _drain(kernel: Kernel, fd: int, forward: bool = True) -> None:
    """Forward everything the kernel has written so far on its stdout or stderr pipe (read and
    dropped without `forward`: between cells nothing is any call's output)."""
    if fd in kernel.closed:
        return
    os.set_blocking(fd, False)
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                kernel.closed.add(fd)
                return
            if forward:
                _emit({"ev": "out", "fd": 1 if fd == kernel.out else 2, "b": base64.b64encode(chunk).decode()})
    except BlockingIOError:
        return
    finally:
        os.set_blocking(fd, True)


def _start() -> Kernel:
    kernel = Kernel()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select(kernel.watched(), [], [], 0.2)
        for fd in ready:
            if fd == kernel.rep:
                if _read_reports(kernel):
                    return kernel
            else:
                _drain(kernel, fd)
        if kernel.exited() is not None:
            break
    kernel.close()
    raise RuntimeError("the session's kernel did not start")


def _read_reports(kernel: Kernel, wait: bool = True) -> list[Any]:
    """Read the kernel's report pipe; the reports read whole (a kernel that closed it sends none).
    Without `wait`, only what is there already."""
    if kernel.rep in kernel.closed:
        return []
    os.set_blocking(kernel.rep, wait)
    try:
        chunk = os.read(kernel.rep, 1 << 16)
    except BlockingIOError:
        return []
    finally:
        os.set_blocking(kernel.rep, True)
    if not chunk:
        kernel.closed.add(kernel.rep)
        return []
    kernel.buffer += chunk
    *lines, kernel.buffer = kernel.buffer.split(b"\n")
    reports: list[Any] = []
    for line in lines:
        try:
            reports.append(json.loads(line))
        except ValueError:
            continue
    return reports


def _mine(reports: list[Any], cell: str | None) -> Json | None:
    """The report of the running cell among those read (any other is not the kernel's to send)."""
    for report in reports:
        if cell is not None and isinstance(report, dict) and report.get("id") == cell:
            return report
    return None


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


OPS = session_ops.Ops(_emit)


def main() -> int:
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # a cell's orphans become ours (also when not init)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: as init, a SIGINT from the code is dropped
    return Supervisor().run()


class Supervisor:
    """The session's loop: the worker's requests on stdin (a cell to run, an interrupt, a file,
    process or watcher op), the kernel's reports and output, and the processes' and watchers'
    output. One cell runs at a time; when one ends, its kernel hands over to its copy, or is
    replaced by a fresh one, and the worker is told which."""

    def __init__(self) -> None:
        self.kernel = _start()
        self.pending = b""
        self.cell: str | None = None  # the running cell's id
        self.oom_before = 0
        self.kill_at: float | None = (
            None  # set when the running cell was interrupted: its kernel is restarted by then at the latest
        )
        self.next_sweep = 0.0

    def run(self) -> int:
        """Serve until the worker closes stdin; the exit status."""
        _emit({"ev": "ready", "restarted": False})
        procs, watchers = OPS.processes, OPS.watchers
        while True:
            ready, _, _ = select.select([0, *self.kernel.watched(), *procs.watched(), *watchers.watched()], [], [], 0.1)
            report = None
            for fd in ready:
                if fd == 0:
                    chunk = os.read(0, 1 << 20)
                    if not chunk:
                        self.kernel.close()
                        return 0
                    self._take(chunk)
                elif fd == self.kernel.rep:
                    report = _mine(_read_reports(self.kernel), self.cell) or report
                elif not procs.readable(fd) and not watchers.readable(fd):
                    _drain(self.kernel, fd, forward=self.cell is not None)
            self._tidy()
            status = self.kernel.exited()
            if report is None and status is not None and self.cell is not None:
                report = _mine(
                    _read_reports(self.kernel, wait=False), self.cell
                )  # written just before the process left
            overdue = self.kill_at is not None and time.monotonic() >= self.kill_at
            if report is not None or status is not None or overdue:
                self._cell_over(report, overdue)

    def _take(self, chunk: bytes) -> None:
        """The worker's requests, one JSON object per line (a line may come in several chunks)."""
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            op = request.get("op")
            if op == "run" and self.cell is None:
                self.cell, self.oom_before = request["id"], cgroup_figure("oom_kills")
                code, env, context = request.get("code", ""), request.get("env", {}), request.get("context") or ""
                self.kernel.send({"id": self.cell, "code": code, "env": env, "context": context})
            elif op == "interrupt":
                if self.cell is not None and request.get("id") == self.cell:
                    self.kernel.signal(signal.SIGINT)
                    self.kill_at = self.kill_at or time.monotonic() + GRACE_S
            elif op != "run":
                OPS.handle(request)

    def _tidy(self) -> None:
        """Processes past their lifetime ended (and their ends reported now, not at the next cell);
        between cells, whatever left its command's session (setsid) is nobody's and goes."""
        procs = OPS.processes
        if procs.timed():
            procs.expire()
            _reap(self.kernel)
        if self.cell is None and time.monotonic() >= self.next_sweep:
            self.kernel.sweep()
            self.next_sweep = time.monotonic() + SWEEP_S

    def _cell_over(self, report: Json | None, overdue: bool) -> None:
        """The cell reported its end, the kernel process ended, or an interrupted cell did not stop
        in time: the kernel hands over to its copy, or a fresh one replaces it."""
        kernel = self.kernel
        _drain(kernel, kernel.out)
        _drain(kernel, kernel.err)
        changed = [p for p in report.get("changed", []) if isinstance(p, str)] if report else []
        if report is not None and kernel.hand_over(report):
            helpers = report.get("helpers")
            helpers = helpers if isinstance(helpers, list) else []
            kernel.helpers = {p for p in helpers if _int(p, 0) > 1 and _is_context(p)}
            kernel.sweep()
            _emit({"ev": "end", "id": self.cell, "status": _int(report.get("status"), 1), "changed": changed,
                   "restarted": False, "oom": False, "peak": cgroup_figure("peak"), "reason": None})  # fmt: skip
            self.cell, self.kill_at = None, None
            return
        # Not handed over, not stopped in time after an interrupt, or the kernel died: everything stops,
        # a fresh kernel, and say so.
        if report is not None:
            code = _int(report.get("status"), 1)
            reason = "the kernel did not hand over to its copy after the cell; it was restarted"
        else:
            if overdue:
                kernel.signal(signal.SIGKILL)
            status = kernel.exited(block=True)
            code = os.waitstatus_to_exitcode(status) if status else 137
            code = code if code >= 0 else 128 - code
            reason = (
                "the cell did not stop when interrupted; the kernel was restarted"
                if overdue
                else "the kernel process ended during the cell; it was restarted"
            )
        _drain(kernel, kernel.out)
        _drain(kernel, kernel.err)
        oom = cgroup_figure("oom_kills") > self.oom_before
        kernel.close()
        self.kernel = _start()
        if self.cell is not None:
            _emit({"ev": "end", "id": self.cell, "status": code, "changed": changed, "restarted": True, "oom": oom,
                   "peak": cgroup_figure("peak"), "reason": reason})  # fmt: skip
        else:
            _emit({"ev": "ready", "restarted": True})
        self.cell, self.kill_at = None, None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
