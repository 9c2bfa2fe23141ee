"""execbox sandbox launcher: PID 1 of every sandbox.

Before user code: unpack the job's small files from stdin into /workspace. Then fork the program
(the rest of stdin is its stdin), reap every child, and when the program ends kill whatever it
left behind. Only then does it tell the worker the run is over (a per-run marker on stderr, after
all of the program's output, with one byte saying whether out/ holds anything), and wait for SIGUSR1 to exit with the program's status, so that
the workspace stays mounted while the worker collects artifacts through the engine.

The marker only says *when* to collect; status, exit code and signals still come from the engine.
Uses only what python3-minimal ships, imports nothing after the program starts, and is started
with -I -S (no user site, no current directory on sys.path).

stdin carries, in order:
  10 ASCII digits      length N of the header
  N bytes              header lines: "nonce <hex>" (optional: without it the launcher exits
                       with the program), then "<size> <octal mode> <path>" per file
  the files' bytes     concatenated in header order
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
    header = _read_exact(int(_read_exact(10))).decode("utf-8")
    for line in header.splitlines():
        if line.startswith("nonce "):
            nonce = line[6:]
            continue
        size, mode, path = line.split(" ", 2)
        _write_file(_safe_path(path), int(size), int(mode, 8))
    return nonce


def _status_code(status):
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main():
    argv = sys.argv[1:]
    if not argv:
        sys.stderr.write("execbox launcher: no program given\n")
        return LAUNCH_FAILED
    try:
        nonce = _unpack()
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
            os.execvp(argv[0], argv)
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
        os.write(2, marker + produced + b"\x00")
        signal.sigwait(release)
    return _status_code(status)


if __name__ == "__main__":
    os._exit(main())
