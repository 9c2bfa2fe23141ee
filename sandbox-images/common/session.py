"""execbox session supervisor: the program the launcher starts in a session's sandbox.

It keeps one kernel process (kernel.py, an IPython interpreter) and relays between it and the
worker. The worker writes requests on stdin, one JSON object per line:

    {"op": "run", "id": ..., "code": ..., "env": {...}}   run a cell (one at a time)
    {"op": "interrupt", "id": ...}                        the worker's clock ran out for that cell

and reads events on stdout, one JSON object per line, and nothing else ever goes there:

    {"ev": "ready", "restarted": false}                  the kernel waits for a cell
    {"ev": "out", "fd": 1 or 2, "b": base64}              the running cell's stdout / stderr
    {"ev": "end", "id": ..., "status": n, "changed": [...], "restarted": bool, "oom": bool,
     "peak": bytes, "reason": text or null}

An interrupt is SIGINT to the kernel's process group; a kernel that has not finished the cell
GRACE_S later is killed with its whole group and a fresh one started (`restarted`: variables
are gone, the workspace stays). A kernel that dies during a cell (the program exited the
process, the OOM killer) is restarted the same way, and the cell's end says so. When stdin
closes (the worker let go of the session) the supervisor ends, and the launcher with it.

The worker trusts none of this beyond the cell it belongs to: everything here shares the sandbox
with the program, so a program can at most misreport its own session's cells; the worker keeps
its own clock and caps.
"""

import base64
import ctypes
import json
import os
import select
import signal
import sys
import time

KERNEL = ("python3", "/opt/execbox/kernel.py")
GRACE_S = 2.0
READY_TIMEOUT_S = 60.0
PR_SET_DUMPABLE = 4


def _emit(event):
    data = (json.dumps(event) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _cgroup_value(paths, key=None):
    for path in paths:
        try:
            with open(path) as f:
                if key is None:
                    return int(f.read().strip())
                for line in f:
                    if line.startswith(key + " "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


def _oom_kills():
    return _cgroup_value(("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"), "oom_kill")


def _peak():
    return _cgroup_value(("/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes"))


class Kernel:
    """The kernel process and the supervisor's ends of its four pipes."""

    def __init__(self):
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
        self.buffer = b""
        self.alive = True
        self.closed = set()
        """Pipes the kernel closed (a program may close its own stdout): no longer watched."""

    def watched(self):
        return [fd for fd in (self.rep, self.out, self.err) if fd not in self.closed]

    def send(self, request):
        data = (json.dumps(request) + "\n").encode()
        while data:
            data = data[os.write(self.ctl, data) :]

    def signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def exited(self, block=False):
        """The kernel's wait status once it has ended (reaped), else None."""
        if not self.alive:
            return 0
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return None
        self.alive = False
        return status

    def close(self):
        self.signal(signal.SIGKILL)
        self.exited(block=True)
        for fd in (self.ctl, self.out, self.err, self.rep):
            try:
                os.close(fd)
            except OSError:
                pass


def _drain(kernel, fd):
    """Forward everything the kernel has written so far on its stdout or stderr pipe."""
    if fd in kernel.closed:
        return
    os.set_blocking(fd, False)
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                kernel.closed.add(fd)
                return
            _emit({"ev": "out", "fd": 1 if fd == kernel.out else 2, "b": base64.b64encode(chunk).decode()})
    except BlockingIOError:
        return
    finally:
        os.set_blocking(fd, True)


def _start():
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


def _read_reports(kernel):
    """Read the kernel's report pipe; the reports read whole (a kernel that closed it sends none)."""
    chunk = os.read(kernel.rep, 1 << 16)
    if not chunk:
        kernel.closed.add(kernel.rep)
        return []
    kernel.buffer += chunk
    *lines, kernel.buffer = kernel.buffer.split(b"\n")
    reports = []
    for line in lines:
        try:
            reports.append(json.loads(line))
        except ValueError:
            continue
    return reports


def main():
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    kernel = _start()
    _emit({"ev": "ready", "restarted": False})
    pending = b""
    cell = None  # the running cell's id
    oom_before = 0
    kill_at = None  # when an interrupted cell's kernel is killed
    while True:
        ready, _, _ = select.select([0, *kernel.watched()], [], [], 0.1)
        for fd in ready:
            if fd == 0:
                chunk = os.read(0, 1 << 20)
                if not chunk:
                    kernel.close()
                    return 0
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    request = json.loads(line)
                    if request.get("op") == "run" and cell is None:
                        cell, oom_before = request["id"], _oom_kills()
                        kernel.send({"id": cell, "code": request.get("code", ""), "env": request.get("env", {})})
                    elif request.get("op") == "interrupt" and cell is not None and request.get("id") == cell:
                        kernel.signal(signal.SIGINT)
                        kill_at = time.monotonic() + GRACE_S
            elif fd == kernel.rep:
                for report in _read_reports(kernel):
                    if cell is not None and report.get("id") == cell:
                        _drain(kernel, kernel.out)
                        _drain(kernel, kernel.err)
                        changed = [p for p in report.get("changed", []) if isinstance(p, str)]
                        _emit({"ev": "end", "id": cell, "status": int(report.get("status", 1)), "changed": changed,
                               "restarted": False, "oom": False, "peak": _peak(), "reason": None})
                        cell, kill_at = None, None
            else:
                _drain(kernel, fd)
        status = kernel.exited()
        overdue = kill_at is not None and time.monotonic() >= kill_at
        if status is None and not overdue:
            continue
        # The kernel died, or did not stop after an interrupt: a fresh one, and say so.
        if overdue:
            kernel.signal(signal.SIGKILL)
            status = kernel.exited(block=True)
            reason = "the cell did not stop when interrupted; the kernel was restarted"
        else:
            reason = "the kernel process ended during the cell; it was restarted"
        _drain(kernel, kernel.out)
        _drain(kernel, kernel.err)
        oom = _oom_kills() > oom_before
        kernel.close()
        code = os.waitstatus_to_exitcode(status) if status else 137
        kernel = _start()
        if cell is not None:
            _emit({"ev": "end", "id": cell, "status": code if code >= 0 else 128 - code, "changed": [],
                   "restarted": True, "oom": oom, "peak": _peak(), "reason": reason})
        else:
            _emit({"ev": "ready", "restarted": True})
        cell, kill_at = None, None


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
