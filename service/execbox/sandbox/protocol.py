"""The launcher's wire protocol (sandbox-images/common/launch.py is the other end).

The container's command is a fixed argv: the image's launcher (PID 1) followed by the language's
command. On stdin the launcher first reads a frame: a 10-digit header length, header lines (a
nonce, the environment's size, then `size mode path` per file), the environment (NUL-separated
`NAME=value`) and the files' bytes; then the program's own stdin follows. When the program ends
the launcher writes an end-of-run marker at the end of stdout and of stderr:
`\n\0execbox-done:<nonce>:<produced>:<status>:<oom>:<peak>:\0`, where status is the exit status, or
`L1`-`L3` when the launcher itself failed. It then holds the container open until it receives
RELEASE_SIGNAL (or is removed), so that the worker can collect the output directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An execute-only copy of python3 (sandbox-images/common/harden.sh): see launch.py on why. gVisor
# cannot load an unreadable binary; there the launcher relies on prctl(PR_SET_DUMPABLE, 0) alone.
LAUNCHER = ("/usr/bin/python3-launcher", "-I", "-S", "/opt/execbox/launch.py")
GVISOR_LAUNCHER = ("/usr/bin/python3", "-I", "-S", "/opt/execbox/launch.py")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
"""The launcher's environment in every runtime (a run's own travels in its frame)."""
RELEASE_SIGNAL = "SIGUSR1"
"""Lets a launcher that holds its finished container exit (with the program's status)."""


def frame_files(
    files: tuple[tuple[str, bytes], ...],
    nonce: str = "",
    env: tuple[tuple[str, str], ...] = (),
    become: bool = False,
) -> bytes:
    """The launcher's stdin frame: header length, header lines, then the environment and files.
    With `become` the launcher does not fork the program but execs it in its place, as PID 1 (a
    session's supervisor: its code cannot signal it); it then writes no end-of-run marker."""
    environ = b"".join(f"{name}={value}".encode() + b"\0" for name, value in env)
    lines = [f"nonce {nonce}\n"] if nonce else []
    lines += ["exec\n"] if become else []
    lines += [f"environ {len(environ)}\n"] if environ else []
    lines += [f"{len(data)} 644 {path}\n" for path, data in files]
    encoded = "".join(lines).encode()
    return b"%010d" % len(encoded) + encoded + environ + b"".join(data for _, data in files)


def done_marker(nonce: str) -> bytes:
    """The start of the launcher's end-of-run marker; "produced:status:oom:" and a NUL follow."""
    return b"\n\x00execbox-done:%s:" % nonce.encode()


_MARKER_TAIL = re.compile(rb"([01]):(\d{1,3}|L\d):([01]):(\d{1,20}):\x00\Z")
MARKER_TAIL_MAX = len(b"1:255:1::\x00") + 20
LAUNCHER_FAULTS = {
    b"L1": "the sandbox's init could not unpack the job's files",
    b"L2": "the sandbox's init could not start the language's program (is the image complete?)",
    b"L3": "the sandbox's init failed",
}
"""What the launcher reports in place of an exit status when it failed itself (launch.py FAULTS)."""


@dataclass(frozen=True)
class Report:
    """The launcher's end-of-run marker, read."""

    start: int
    """Where the marker starts in the text searched."""
    produced: bool
    """out/ holds something to collect."""
    exit_code: int | None
    fault: str | None
    """Set instead of exit_code when the launcher failed itself."""
    oom: bool
    peak: int | None


def read_marker(tail: bytes, marker: bytes) -> Report | None:
    """The report at the end of `tail` (which must end with the marker's closing NUL), if any."""
    start = tail.rfind(marker)
    if start < 0:
        return None
    fields = _MARKER_TAIL.match(tail, start + len(marker))
    if fields is None:
        return None
    status = fields.group(2)
    fault = LAUNCHER_FAULTS.get(status, LAUNCHER_FAULTS[b"L3"]) if status.startswith(b"L") else None
    return Report(
        start=start,
        produced=fields.group(1) == b"1",
        exit_code=None if fault else int(status),
        fault=fault,
        oom=fields.group(3) == b"1",
        peak=int(fields.group(4)) or None,
    )
