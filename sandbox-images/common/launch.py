"""execbox sandbox launcher: PID 1 of every sandbox.

Before user code: unpack the job's small files and environment from stdin into /workspace. Then
fork the program (the rest of stdin is its stdin), reap every child, and when the program ends
kill whatever it left behind. Only then does it tell the worker the run is over, with a per-run
marker at the end of stdout and of stderr, after all of the program's output:

    \n \0 "execbox-done:" nonce ":" produced ":" exit status ":" oom ":" peak ":" \0

(produced: 1 when out/ holds anything; oom: 1 when the kernel's OOM killer fired in the sandbox;
peak: the sandbox's memory high-water mark in bytes, 0 when the cgroup does not say).
It then holds the container open (until the worker removes it, or SIGUSR1), so that the
workspace stays mounted while the worker collects artifacts through the engine.

The marker is trusted because the program cannot know the nonce: it arrives on stdin before the
program exists, and this process runs from an execute-only copy of python3, which makes the kernel
mark it non-dumpable, so the program (same uid, no capabilities) can neither ptrace it nor read
its memory. Without a marker (the launcher was killed, or the run was stopped from outside) the
worker takes status and OOM from the engine instead.

Uses only what python3-minimal ships, imports nothing after the program starts, and is started
with -I -S (no user site, no current directory on sys.path).

stdin carries, in order:
  10 ASCII digits      length N of the header
  N bytes              header lines: "nonce <hex>" (optional: without it the launcher exits
                       with the program), "environ <size>" (optional: NUL-separated NAME=value
                       pairs added to the program's environment), then "<size> <octal mode>
                       <path>" per file
  the data             the environ block and the files' bytes, in header order
  the rest             the program's own stdin (the launcher never reads past the files)
"""

import os
import signal
import sys

WORKDIR = "/workspace"
LAUNCH_FAILED = 120


def _read_exact(n):
    chunks = []
    while n > 0:
        chunk = os.read(0, min(n, 1 << 20))
        if not chunk:
            raise EOFError("stdin ended before the job's files were complete")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _safe_path(rel):
    parts = rel.split("/")
    if rel.startswith("/") or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise ValueError("refusing file path %r" % rel)
    return os.path.join(WORKDIR, *parts)


def _write_file(path, size, mode):
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


def _unpack():
    os.makedirs(os.path.join(WORKDIR, "out"), exist_ok=True)  # the output directory always exists
    nonce = ""
    env = dict(os.environ)
    header = _read_exact(int(_read_exact(10))).decode("utf-8")
    for line in header.splitlines():
        if line.startswith("nonce "):
            nonce = line[6:]
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


def _peak_memory():
    """The sandbox cgroup's memory high-water mark in bytes (v1 or v2), 0 when unknown."""
    for path in ("/sys/fs/cgroup/memory/memory.max_usage_in_bytes", "/sys/fs/cgroup/memory.peak"):
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return 0


def _oom_kills():
    """1 when the OOM killer fired in this sandbox's memory cgroup (v1 or v2), else 0."""
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return 1 if int(line.split()[1]) > 0 else 0
        except (OSError, ValueError):
            continue
    return 0


def _status_code(status):
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main():
    argv = sys.argv[1:]
    if not argv:
        sys.stderr.write("execbox launcher: no program given\n")
        return LAUNCH_FAILED
    try:
        nonce, env = _unpack()
    except (OSError, ValueError, EOFError) as exc:
        sys.stderr.write("execbox launcher: %s\n" % exc)
        return LAUNCH_FAILED
    release = {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, release)
    marker = ("\n\x00execbox-done:%s:" % nonce).encode()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, release)
        try:
            os.chdir(WORKDIR)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, ("execbox launcher: cannot run %s: %s\n" % (argv[0], exc)).encode())
        os._exit(127)
    os.close(0)
    status = 0
    while True:  # as PID 1, reap every orphan until the program itself ends
        pid, st = os.waitpid(-1, 0)
        if pid == child:
            status = st
            break
    if os.getpid() == 1:  # only as the sandbox's init: kill(-1) elsewhere would hit the whole host
        try:
            os.kill(-1, signal.SIGKILL)  # everything the program left behind, never PID 1
        except ProcessLookupError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if nonce:  # a worker waits to collect; without a nonce (smoke tests) just end
        try:
            produced = b"1" if os.listdir(os.path.join(WORKDIR, "out")) else b"0"
        except OSError:
            produced = b"1"  # let the worker look for itself
        marker += b"%s:%d:%d:%d:\x00" % (produced, _status_code(status), _oom_kills(), _peak_memory())
        os.write(1, marker)
        os.write(2, marker)
        signal.sigwait(release)
    return _status_code(status)


if __name__ == "__main__":
    os._exit(main())
