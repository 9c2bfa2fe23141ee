"""execbox sandbox launcher: unpack the job's files from stdin, then exec the program.

Uses only what python3-minimal ships (no json), so every image can carry it. Runs as the sandbox's unprivileged user before any user code, and replaces itself with the
program (exec), so nothing of the service runs after user code starts.

stdin carries, in order:
  10 ASCII digits      length N of the header
  N bytes              header, one line per file: "<size> <octal mode> <path>\n" (UTF-8)
  the files' bytes     concatenated in header order
  the rest             the program's own stdin (the launcher never reads past the files)
"""

import os
import sys

WORKDIR = "/workspace"


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


def main():
    argv = sys.argv[1:]
    if not argv:
        sys.stderr.write("execbox launcher: no program given\n")
        return 120
    try:
        header = _read_exact(int(_read_exact(10))).decode("utf-8")
        for line in header.splitlines():
            size, mode, path = line.split(" ", 2)
            _write_file(_safe_path(path), int(size), int(mode, 8))
    except (OSError, ValueError, EOFError) as exc:
        sys.stderr.write("execbox launcher: %s\n" % exc)
        return 120
    os.chdir(WORKDIR)
    os.execvp(argv[0], argv)
    return 120


if __name__ == "__main__":
    sys.exit(main())
