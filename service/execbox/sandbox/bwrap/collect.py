"""The bubblewrap helper's collection: a run's output directory as a tar stream, read as root from
the host side of the run's workspace.

Only once every process of the run is gone (the helper kills the cgroup first), so nothing can
swap a directory for a link during the walk; only `out/` or the whole workspace
(execbox.sandbox.bwrap.checks), so no link on the way there is followed; links inside are stored
as links, and FIFOs, sockets and devices as entries, never opened. The sizes tar counts (a sparse
file counts whole) are capped at the run's disk.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

PIECE = 1 << 16


class _Frames:
    """A write-only file object handing what tarfile writes to `send`, in pieces."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        while len(self._buffer) >= PIECE:
            self._send(bytes(self._buffer[:PIECE]))
            del self._buffer[:PIECE]
        return len(data)

    def flush(self) -> None:
        if self._buffer:
            self._send(bytes(self._buffer))
            self._buffer.clear()


def tar_output(workspace: Path, collect: str, budget: int, send: Callable[[bytes], None]) -> str | None:
    """Send `workspace/collect` as a tar stream; why not, or None (a missing directory sends nothing)."""
    base = workspace / collect if collect else workspace
    left = [budget]

    def within(member: tarfile.TarInfo) -> tarfile.TarInfo:
        left[0] -= member.size
        if left[0] < 0:
            raise OSError(f"the output directory holds more than the run's disk ({budget >> 20} MiB)")
        return member

    try:
        if base.is_symlink():
            raise OSError(f"/workspace/{collect} is a link")
        if not base.is_dir():
            return None
        frames = _Frames(send)
        with tarfile.open(fileobj=cast(Any, frames), mode="w|", format=tarfile.PAX_FORMAT) as archive:
            archive.add(base, arcname=base.name or "workspace", recursive=True, filter=within)
        frames.flush()
    except OSError as exc:
        return str(exc)
    return None
