"""The bubblewrap helper's collection: a run's output directory as a tar stream, read as root from
the host side of the run's workspace.

Only once every process of the run is gone (the helper kills the cgroup first), so nothing can
swap a directory for a link during the walk; only `out/` or the whole workspace
(execbox.sandbox.bwrap.checks), so no link on the way there is followed: an `out` that is itself a
link is sent as that link (as the engine sends it under runc), never followed. Links inside are
stored as links, and FIFOs, sockets and devices as entries, never opened. The sizes tar counts (a
sparse file counts whole) are capped at the run's disk.

The walk is a loop, not a recursion (a thousand nested directories are a program's to make), and
bounded: directories deeper than DEPTH are sent without their contents (the worker's collector
lists them as too deep), and the walk stops after MEMBERS entries or WITHIN_S seconds, each a little
past the worker's own bounds (execbox.files.collect), so that the worker always sees the cut first
and says so in the result.
"""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

PIECE = 1 << 16
DEPTH = 64
"""Directory levels below the collected directory that are walked."""
MEMBERS = 10_050
"""Entries sent at most (the worker's collector reads 10,000)."""
WITHIN_S = 15.0
"""Time the walk may take (the worker's collector stops reading after 10 s)."""


@dataclass(frozen=True)
class Collected:
    error: str | None = None
    """Why the directory could not be sent (the run's fault, not the program's)."""
    cut: str | None = None
    """Why the walk stopped before the end (the program made more than it may have looked at)."""


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


def _walk(base: Path, name: str, depth: int) -> Iterator[tuple[Path, str]]:
    """(path, member name) of `base` and everything under it, parents first, without recursion;
    directories `depth` levels down are given without their contents."""
    stack = [(base, name, 0)]
    while stack:
        path, arcname, level = stack.pop()
        yield path, arcname
        if level < depth and not path.is_symlink() and path.is_dir():
            try:
                children = sorted(os.listdir(path), reverse=True)
            except OSError:
                continue
            stack.extend((path / child, f"{arcname}/{child}", level + 1) for child in children)


def tar_output(
    workspace: Path,
    collect: str,
    budget: int,
    send: Callable[[bytes], None],
    members: int = MEMBERS,
    within_s: float = WITHIN_S,
    depth: int = DEPTH,
) -> Collected:
    """Send `workspace/collect` as a tar stream (a missing directory sends nothing)."""
    base = workspace / collect if collect else workspace
    if not base.is_symlink() and not base.is_dir():
        return Collected()
    left, deadline, sent = budget, time.monotonic() + within_s, 0
    cut: str | None = None
    frames = _Frames(send)
    try:
        with tarfile.open(fileobj=cast(Any, frames), mode="w|", format=tarfile.PAX_FORMAT) as archive:
            for path, arcname in _walk(base, base.name or "workspace", depth):
                if sent >= members or time.monotonic() > deadline:
                    cut = f"the walk stopped after {sent} entries ({within_s:.0f} s at most, {members} entries)"
                    break
                try:
                    member = archive.gettarinfo(str(path), arcname)
                except FileNotFoundError:
                    continue
                if member is None:  # a socket: tar has no such entry (nor does the engine's archive)
                    continue
                member.mtime = int(member.mtime)  # whole seconds: no PAX header per entry
                left -= member.size if member.isreg() else 0
                if left < 0:
                    raise OSError(f"the output directory holds more than the run's disk ({budget >> 20} MiB)")
                if member.isreg():
                    with open(path, "rb") as data:
                        archive.addfile(member, data)
                else:
                    archive.addfile(member)
                sent += 1
        frames.flush()
    except OSError as exc:
        return Collected(error=str(exc))
    return Collected(cut=cut)
