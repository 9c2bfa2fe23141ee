"""execbox sandbox launcher: unpack the job's files from stdin, then exec the program.

Runs as the sandbox's unprivileged user before any user code, and replaces itself with the
program (exec), so nothing of the service runs after user code starts.

stdin carries, in order:
  10 ASCII digits      length N of the header
  N bytes              JSON header: {"files": [{"path": str, "size": int, "mode": int}, ...]}
  the files' bytes     concatenated in header order
  the rest             the program's own stdin (the launcher never reads past the files)
"""

import json
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
        header = json.loads(_read_exact(int(_read_exact(10))))
        for entry in header["files"]:
            _write_file(_safe_path(entry["path"]), int(entry["size"]), int(entry.get("mode", 0o644)))
    except (OSError, ValueError, EOFError, KeyError) as exc:
        sys.stderr.write("execbox launcher: %s\n" % exc)
        return 120
    os.chdir(WORKDIR)
    os.execvp(argv[0], argv)
    return 120


if __name__ == "__main__":
    sys.exit(main())
