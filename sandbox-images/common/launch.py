"""execbox sandbox launcher: PID 1 of every sandbox.

Before user code: unpack the job's small files and environment from stdin into /workspace. Then
fork the program (the rest of stdin is its stdin), reap every child, and when the program ends
kill whatever it left behind. Only then does it tell the worker the run is over, with a per-run
marker at the end of stdout and of stderr, after all of the program's output:

    \n \0 "execbox-done:" nonce ":" produced ":" exit status ":" oom ":" peak ":" \0

(produced: 1 when out/ holds anything; exit status: the program's, or "L" and a digit when the
launcher itself failed, see FAULTS; oom: 1 when the kernel's OOM killer fired in the sandbox;
peak: the sandbox's memory high-water mark in bytes, 0 when the cgroup does not say).
It then holds the container open (until the worker removes it, or SIGUSR1), so that the
workspace stays mounted while the worker collects artifacts through the engine.

A session's supervisor is not forked but takes the launcher's place (the frame's header says
"exec"): it is then PID 1 of the sandbox, and the kernel drops every signal sent to a namespace's
init from inside the namespace for which it installed no handler, SIGSTOP and SIGKILL included. So
the code it supervises, which runs as the same uid, cannot stop or kill it. No marker is written:
the session ends when the supervisor does, and with it every process in the sandbox.

The marker is trusted because the program cannot know the nonce: it arrives on stdin before the
program exists, and this process is non-dumpable, so the program (same uid, no capabilities) can
neither ptrace it nor read its memory: it marks itself so (prctl PR_SET_DUMPABLE 0) before it
reads anything, and under runc it also runs from an execute-only copy of python3, which the kernel
marks non-dumpable by itself (gVisor cannot load an unreadable binary, so there prctl alone
does). Without a marker (the launcher was killed, or the run was stopped from outside) the worker
takes status and OOM from the engine instead.

The program runs in a session and process group of its own (killing its group never reaches
PID 1). Every wait status is handled: a program that makes PID 1 its tracer (PTRACE_TRACEME, or
an orphan doing so) is resumed at each stop with the signal it stopped for, so it runs as if
untraced; a program that stops itself without a tracer stays stopped until the worker's clock
ends the run. The launcher's own faults never reach the program's streams: they are reported in
the marker (status "L<n>"), and the worker ends the run as a service error.

A preloaded interpreter: when the container's environment names one (EXECBOX_PRELOAD, a command,
set by the worker for warm-pool containers only), the launcher starts it before the frame arrives,
in the session the program would get, so that it can import its modules ahead of the run (see
preload.py). Once the files are unpacked it is handed the program's argv and environment; if it
takes the job it is the program (the launcher waits for it as for any program), otherwise it
exits and the program is started fresh, as without it. It never sees the nonce: it is started
before the frame is read, and the launcher reads the frame itself.

A job may arrive while the preload is still importing. It says a "." as its interpreter is up and
after each module, then "r". With the expected costs the worker passes (EXECBOX_PRELOAD_COSTS, in
ms: the start's, then each module's), the launcher weighs the two ways: a fresh start costs the
start plus the modules up to the last one the program names (a module may need those before it);
waiting costs what the preload has still to do. It waits when that is no more than the fresh
start, and never longer than the fresh start would take; else it starts fresh at once.

Uses python3-minimal and ctypes (for ptrace), imports nothing after the program starts, and is
started with -I -S (no user site, no current directory on sys.path).

stdin carries, in order:
  10 ASCII digits      length N of the header
  N bytes              header lines: "nonce <hex>" (optional: without it the launcher exits
                       with the program), "exec" (optional: become the program, see above),
                       "environ <size>" (optional: NUL-separated NAME=value pairs added to the
                       program's environment), then "<size> <octal mode> <path>" per file
  the data             the environ block and the files' bytes, in header order
  the rest             the program's own stdin (the launcher never reads past the files)
"""

import ctypes
import os
import select
import signal
import sys
import time

WORKDIR = "/workspace"
LAUNCH_FAILED = 120
FAULTS = {"unpack": 1, "exec": 2, "internal": 3}
"""Marker status "L<n>": the job's files could not be unpacked, the program could not be started,
or the launcher failed otherwise."""
PRELOAD_ENV = ("EXECBOX_PRELOAD", "EXECBOX_PRELOAD_MODULES", "EXECBOX_PRELOAD_COSTS")
"""The container's settings for a preloaded interpreter; never part of the program's environment."""
PROGRAM_SCAN = 1 << 20
"""How much of the program's file is searched for the preloaded modules' names."""
PTRACE_CONT = 7
PR_SET_DUMPABLE = 4
_NOT_INJECTED = (signal.SIGTRAP, signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)


def _read_exact(n: int) -> bytes:
    chunks: list[bytes] = []
    while n > 0:
        chunk = os.read(0, min(n, 1 << 20))
        if not chunk:
            raise EOFError("stdin ended before the job's files were complete")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _safe_path(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"refusing file path {rel!r}")
    return os.path.join(WORKDIR, *parts)


def _write_file(path: str, size: int, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode & 0o755)
    try:
        remaining = size
        while remaining > 0:
            chunk = _read_exact(min(remaining, 1 << 20))
            os.write(fd, chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)


_NONCE = [""]
"""The run's nonce once read, for reporting a fault from anywhere."""


def _read_header() -> tuple[str, list[str]]:
    """(nonce, header lines): the nonce comes first, so even a later fault can be reported."""
    lines = _read_exact(int(_read_exact(10))).decode("utf-8").splitlines()
    nonce = lines[0][6:] if lines and lines[0].startswith("nonce ") else ""
    _NONCE[0] = nonce
    return nonce, lines


def _unpack(header: tuple[str, list[str]]) -> tuple[str, dict[str, str]]:
    nonce, lines = header
    os.makedirs(os.path.join(WORKDIR, "out"), exist_ok=True)  # the output directory always exists
    env = dict(os.environ)
    for line in lines:
        if line.startswith("nonce ") or line == "exec":
            continue
        if line.startswith("environ "):
            block = _read_exact(int(line[8:])).decode("utf-8")
            for pair in block.split("\0"):
                if pair:
                    name, _, value = pair.partition("=")
                    env[name] = value
            continue
        size, mode, path = line.split(" ", 2)
        _write_file(_safe_path(path), int(size), int(mode, 8))
    return nonce, env


CGROUP_FIGURES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "peak": (("/sys/fs/cgroup/memory.peak", None), ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", None)),
    "oom_kills": (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
    ),
}
"""Where the sandbox's memory cgroup says each figure: cgroup v2's file first, then v1's (a line
"<key> <n>" in it, or the whole file when the key is None)."""


def cgroup_figure(name: str) -> int:
    """A figure of the sandbox's memory cgroup, 0 when it does not say: "peak" (the high-water mark
    in bytes) or "oom_kills" (how often its OOM killer fired). The one reader of both the launcher
    and the session's supervisor (session.py)."""
    for path, key in CGROUP_FIGURES[name]:
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


def _status_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _resume_tracee(pid: int, status: int) -> None:
    """A process that made PID 1 its tracer stopped: let it go on, delivering the signal it stopped
    for (stops themselves are not honoured: there is nobody to continue it)."""
    sig = os.WSTOPSIG(status)
    inject = 0 if sig in _NOT_INJECTED else sig
    _libc.ptrace(PTRACE_CONT, pid, None, ctypes.c_void_p(inject))  # ESRCH: it is gone already


def _wait_for(child: int) -> int:
    """Reap every process until `child` ends; its exit status."""
    while True:
        pid, status = os.waitpid(-1, 0)  # without WUNTRACED: a stop seen here is a ptrace stop
        if os.WIFSTOPPED(status):
            _resume_tracee(pid, status)
        elif pid == child and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
            return status


def _reap_all() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if os.WIFSTOPPED(status):
            _resume_tracee(pid, status)  # so that the SIGKILL it is about to get can end it


def _finish(nonce: str, marker: bytes, status: bytes) -> None:
    """Tell the worker the run is over (the marker, on both streams), then wait to be released."""
    try:
        produced = b"1" if os.listdir(os.path.join(WORKDIR, "out")) else b"0"
    except OSError:
        produced = b"1"  # let the worker look for itself
    marker += b"%s:%s:%d:%d:\x00" % (produced, status, min(cgroup_figure("oom_kills"), 1), cgroup_figure("peak"))
    for fd in (1, 2):
        try:
            os.write(fd, marker)
        except OSError:
            pass  # the engine went away: the worker takes the status from it
    signal.sigwait({signal.SIGUSR1})


def _start_preload(release: set[signal.Signals]) -> tuple[int, int, int] | None:
    """(pid, job pipe, answer pipe) of the preloaded interpreter the container asks for, or None."""
    command = os.environ.get("EXECBOX_PRELOAD", "").split()
    if not command:
        return None
    job_r, job_w = os.pipe()
    answer_r, answer_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(job_r, 3)  # pipes are close-on-exec; these two copies are not
            os.dup2(answer_w, 4)
            os.set_inheritable(3, True)  # dup2 onto itself keeps the flag
            os.set_inheritable(4, True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, release)
            os.chdir(WORKDIR)
            env = {k: v for k, v in os.environ.items() if k != "EXECBOX_PRELOAD"}
            os.execvpe(command[0], command, env)
        except BaseException:
            pass
        os._exit(127)
    os.close(job_r)
    os.close(answer_w)
    return pid, job_w, answer_r


def _said(answer_r: int, timeout_s: float) -> tuple[int, bool]:
    """Read what the preloaded interpreter says until its "r", its end, or timeout_s (0: only what
    is there now): (how many "." it said, whether it said "r")."""
    said = b""
    deadline = time.monotonic() + timeout_s
    while b"r" not in said:
        left = deadline - time.monotonic()
        if not select.select([answer_r], [], [], max(0.0, left))[0]:
            break
        chunk = os.read(answer_r, 64)
        if not chunk:
            return said.count(b"."), False  # it is gone
        said += chunk
    return said.count(b"."), b"r" in said


def _worth_waiting_s(argv: list[str], done: int) -> float:
    """How long to wait for a preload that has said `done` of its steps (its start, then each
    module): a fresh start's expected time when the rest of the preload is expected to take no
    longer, else 0 (also when the container declares no costs)."""
    modules = [m for m in os.environ.get("EXECBOX_PRELOAD_MODULES", "").split(",") if m]
    try:
        costs = [int(ms) / 1000 for ms in os.environ.get("EXECBOX_PRELOAD_COSTS", "").split(",")]
    except ValueError:
        return 0
    if len(costs) != len(modules) + 1:
        return 0
    try:
        with open(os.path.join(WORKDIR, argv[-1]), "rb") as source:
            program = source.read(PROGRAM_SCAN)
    except OSError:
        program = b""
    last = max((i + 1 for i, name in enumerate(modules) if _names(program, name.encode())), default=0)
    fresh_s = sum(costs[: last + 1])
    return fresh_s if sum(costs[done:]) <= fresh_s else 0


def _names(program: bytes, name: bytes) -> bool:
    """Whether `name` stands in the program as a word (an import, or anything else: a mention costs
    at most a wait no longer than the fresh start)."""
    at = program.find(name)
    while at >= 0:
        before = program[at - 1 : at] if at else b" "
        after = program[at + len(name) : at + len(name) + 1] or b" "
        if not (before.isalnum() or before == b"_" or after.isalnum() or after == b"_"):
            return True
        at = program.find(name, at + 1)
    return False


def _hand_over(preloaded: tuple[int, int, int], argv: list[str], env: dict[str, str]) -> int | None:
    """Give the job to the preloaded interpreter if it is ready, or will be sooner than a fresh
    start would be (see the module's docstring): its pid when it took the job, else None (it is
    gone, and the program starts fresh)."""
    pid, job_w, answer_r = preloaded
    job = "\0".join([str(len(argv)), *argv, *("{}={}".format(*item) for item in env.items())]).encode("utf-8")
    try:
        done, ready = _said(answer_r, 0)
        wait_s = 0 if ready else _worth_waiting_s(argv, done)
        if wait_s:
            ready = _said(answer_r, wait_s)[1]
        while ready and job:
            job = job[os.write(job_w, job) :]
    except OSError:
        ready = False  # it died (e.g. its imports did not fit the memory limit)
    os.close(job_w)
    try:
        answer = os.read(answer_r, 1) if ready else b""
    except OSError:
        answer = b""
    os.close(answer_r)
    if answer == b"y":
        return pid
    # Not waited for here: tearing down its memory takes a while, and the program need not wait
    # for that; the launcher's wait for the program reaps it.
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return None


def main() -> int:
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # before the nonce is read; a fork inherits it until exec
    argv = sys.argv[1:]
    if not argv:
        sys.stderr.write("execbox launcher: no program given\n")
        return LAUNCH_FAILED
    release = {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, release)
    preloaded = _start_preload(release)
    header = None
    try:
        header = _read_header()
        nonce, env = _unpack(header)
    except (OSError, ValueError, EOFError, UnicodeDecodeError) as exc:
        nonce = header[0] if header else ""
        if not nonce:  # a smoke test by hand: say it
            sys.stderr.write(f"execbox launcher: {exc}\n")
            return LAUNCH_FAILED
        _finish(nonce, (f"\n\x00execbox-done:{nonce}:").encode(), b"L%d" % FAULTS["unpack"])
        return LAUNCH_FAILED
    marker = (f"\n\x00execbox-done:{nonce}:").encode()
    for name in PRELOAD_ENV:
        env.pop(name, None)
    if "exec" in header[1] and preloaded is None:
        return _become(argv, env, nonce, marker, release)
    child = _hand_over(preloaded, argv, env) if preloaded else None
    if child is not None:
        os.close(0)
        return _after(child, True, nonce, marker)
    exec_failed = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(exec_failed[0])
            os.set_inheritable(exec_failed[1], False)  # closed by a successful exec
            os.setsid()  # its own session and process group: killpg(0) never reaches PID 1
            _exec(argv, env, release)
        except BaseException:
            os.write(exec_failed[1], b"x")
        os._exit(127)
    os.close(exec_failed[1])
    os.close(0)
    started = not os.read(exec_failed[0], 1)
    os.close(exec_failed[0])
    return _after(child, started, nonce, marker)


def _become(argv: list[str], env: dict[str, str], nonce: str, marker: bytes, release: set[signal.Signals]) -> int:
    """Replace this process with the program, which is then PID 1 itself (the frame said "exec":
    a session's supervisor, which the code it runs must not be able to signal)."""
    try:
        _exec(argv, env, release)
    except OSError:
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, release)
    if nonce:
        _finish(nonce, marker, b"L%d" % FAULTS["exec"])
    return LAUNCH_FAILED


def _exec(argv: list[str], env: dict[str, str], release: set[signal.Signals]) -> None:
    """Become the program: the release signal unblocked, in the work directory."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, release)
    os.chdir(WORKDIR)
    os.execvpe(argv[0], argv, env)


def _after(child: int, started: bool, nonce: str, marker: bytes) -> int:
    """Wait for the program, end what it left, report; the launcher's exit status."""
    status = _wait_for(child)
    if os.getpid() == 1:  # only as the sandbox's init: kill(-1) elsewhere would hit the whole host
        try:
            os.kill(-1, signal.SIGKILL)  # everything the program left behind, never PID 1
        except ProcessLookupError:
            pass
    _reap_all()
    if not nonce:  # smoke tests: just end like the program
        return _status_code(status)
    reported = b"%d" % _status_code(status) if started else b"L%d" % FAULTS["exec"]
    _finish(nonce, marker, reported)
    return _status_code(status)


def _guarded() -> int:
    try:
        return main()
    except BaseException:  # never the program's outcome, never a traceback on its streams
        nonce = _NONCE[0]
        if nonce:
            try:
                _finish(nonce, (f"\n\x00execbox-done:{nonce}:").encode(), b"L%d" % FAULTS["internal"])
            except BaseException:
                pass
        return LAUNCH_FAILED


if __name__ == "__main__":
    os._exit(_guarded())
