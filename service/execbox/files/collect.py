"""Collect what a program left in its output directory from the engine's tar stream.

Only regular files are kept; symlinks, hard links, devices and FIFOs are listed as skipped and
never read (so no link can make the worker return a file from outside the directory). Names are
checked before anything is stored, and the store never builds a host path from them. Caps on
count, per-file and total size are applied before a member's bytes are read; whatever passes a
cap is listed as not kept, never dropped silently.

What a program makes costs it, not the service: the stream is read for at most MEMBERS entries and
WITHIN_S seconds (a run making 50,000 empty files is cut there: the result says so and the caps'
error follows), at most LISTED names are listed (then one line says how many more), and directories
deeper than DEPTH are listed once as too deep, their contents never looked at. The engine and the
bubblewrap helper stop their own walks a little after these bounds.
"""

from __future__ import annotations

import fnmatch
import io
import mimetypes
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from execbox.files.blobs import ArtifactStore, ArtifactTooLarge

RESERVED_DIR = ".execbox"
RESULT_FILE = f"{RESERVED_DIR}/result.json"
RESULT_CAP_BYTES = 8 << 20
RICH_DIR = f"{RESERVED_DIR}/results/"
"""Where a Python sandbox leaves rich results (execbox_rich): index.json and one file per representation."""
RICH_INDEX = f"{RICH_DIR}index.json"
MEMBERS = 10_000
"""Entries of the collected directory read at most."""
WITHIN_S = 10.0
"""Time the reading of the collected directory may take."""
LISTED = 100
"""Names listed as not kept at most (then one entry says how many more)."""
DEPTH = 64
"""Directory levels below the collected directory that are looked into."""


@dataclass(frozen=True)
class ArtifactCaps:
    file_bytes: int
    total_bytes: int
    files: int


@dataclass(frozen=True)
class KeptArtifact:
    name: str
    size: int
    sha256: str
    media_type: str


class _StreamReader(io.RawIOBase):
    """A file object over the engine's chunk iterator, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def safe_name(name: str) -> bool:
    """A relative name without traversal, empty parts, control characters or undecodable bytes."""
    if not name or name.startswith("/") or "\\" in name:
        return False
    if any(ord(c) < 0x20 or c == "\x7f" or 0xDC80 <= ord(c) <= 0xDCFF for c in name):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


@dataclass
class Collector:
    """Called by the runtime with the tar stream of `/workspace/<root>`."""

    execution_id: str
    store: ArtifactStore
    caps: ArtifactCaps
    root: str = "out"
    """The collected directory's name as the engine's tar stream has it: "out", or "workspace"
    when the request names its files by glob (relative to the working directory)."""
    globs: tuple[str, ...] = ()
    only: frozenset[str] | None = None
    """When set (a session's call), only these names are the call's artifacts: the others were
    left by earlier calls and are not looked at."""
    kept: list[KeptArtifact] = field(default_factory=list)
    rich_index: bytes | None = None
    rich: dict[str, KeptArtifact] = field(default_factory=dict)
    """Rich results' representations by file name (under RICH_DIR), stored beside the artifacts."""
    not_kept: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    result: bytes | None = None
    over_cap: bool = False
    unlisted: int = 0
    """Names not kept past the LISTED first (counted, not listed)."""
    cut: str | None = None
    """Why the reading stopped before the end of the stream."""

    def __call__(self, chunks: Iterator[bytes]) -> None:
        self._read(chunks)
        if self.cut is not None:
            self.over_cap = True
            self.not_kept.append({"name": "…", "reason": self.cut})
        if self.unlisted:
            self.skipped.append({"name": "…", "reason": f"{self.unlisted} more not kept, not listed (at most "
                                 f"{LISTED} names are)"})  # fmt: skip

    def _list(self, into: list[dict[str, Any]], item: dict[str, Any]) -> None:
        if len(self.not_kept) + len(self.skipped) < LISTED:
            into.append(item)
        else:
            self.unlisted += 1

    def _read(self, chunks: Iterator[bytes]) -> None:
        total, seen, deadline = 0, 0, time.monotonic() + WITHIN_S
        too_deep: str | None = None
        with tarfile.open(fileobj=io.BufferedReader(_StreamReader(chunks), 1 << 16), mode="r|") as tar:
            for member in tar:
                seen += 1
                if seen > MEMBERS or time.monotonic() > deadline:
                    self.cut = (f"the output directory was read for {WITHIN_S:g} s and {MEMBERS} entries at most; "
                                "what came after was not looked at")  # fmt: skip
                    return
                if member.name == self.root and not member.isdir():  # `out` itself a link: never followed
                    self._list(
                        self.skipped, {"name": self.root, "reason": "symlink" if member.issym() else "not_a_dir"}
                    )
                    continue
                name = self._relative(member.name)
                if name is None or (too_deep is not None and name.startswith(too_deep)):
                    continue  # not the collected directory's, or inside one already listed as too deep
                parts = name.split("/")
                if len(parts) > DEPTH or (len(parts) == DEPTH and member.isdir()):
                    # A directory at the bound (the helper sends it alone; the engine what is below too).
                    too_deep = "/".join(parts[:DEPTH]) + "/"
                    self._list(self.skipped, {"name": too_deep[:-1], "reason": f"too_deep: a directory {DEPTH} "
                                              "levels down; what it holds is not collected"})  # fmt: skip
                    continue
                if member.isdir():
                    continue
                if name == self._result_name():
                    self._read_result(tar, member)
                    continue
                rich = self._rich_name(name)
                if rich is not None and member.isreg():
                    self._read_rich(tar, member, rich)
                    continue
                if name.startswith(self._reserved_prefix()) or (self.globs and not self._wanted(name)):
                    continue
                if self.only is not None and name not in self.only:
                    continue
                if not safe_name(name):
                    shown = name.encode("utf-8", "backslashreplace").decode()
                    self._list(self.skipped, {"name": shown, "reason": "unsafe_name"})
                    continue
                if not member.isreg():
                    kind = "symlink" if member.issym() else "hardlink" if member.islnk() else "not_a_file"
                    self._list(self.skipped, {"name": name, "reason": kind})
                    continue
                over = self._cap_reason(member.size, total)
                if over:
                    self.over_cap = True
                    self._list(self.not_kept, {"name": name, "size": member.size, "reason": over})
                    continue
                data = tar.extractfile(member)
                assert data is not None  # a regular member always has data
                try:
                    size, digest = self.store.put(self.execution_id, name, data, member.size)
                except ArtifactTooLarge:
                    self._list(self.skipped, {"name": name, "reason": "changed_while_read"})
                    continue
                total += size
                media = mimetypes.guess_type(name)[0] or "application/octet-stream"
                self.kept.append(KeptArtifact(name, size, digest, media))

    def _relative(self, member_name: str) -> str | None:
        # The engine names members after the collected directory: "out/x/y.png".
        prefix = self.root + "/"
        return member_name[len(prefix) :] if member_name.startswith(prefix) else None

    def _reserved_prefix(self) -> str:
        return f"{RESERVED_DIR}/" if self.root == "out" else f"out/{RESERVED_DIR}/"

    def _result_name(self) -> str:
        return RESULT_FILE if self.root == "out" else f"out/{RESULT_FILE}"

    def _wanted(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.globs)

    def _cap_reason(self, size: int, total: int) -> str | None:
        if len(self.kept) >= self.caps.files:
            return f"more than {self.caps.files} files"
        if size > self.caps.file_bytes:
            return f"file larger than {self.caps.file_bytes} bytes"
        if total + size > self.caps.total_bytes:
            return f"total would pass {self.caps.total_bytes} bytes"
        return None

    def _rich_name(self, name: str) -> str | None:
        """The name relative to out/ when it is a rich result's file, else None."""
        relative = name if self.root == "out" else (name[len("out/") :] if name.startswith("out/") else None)
        return relative if relative is not None and relative.startswith(RICH_DIR) else None

    def _read_rich(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        """A rich result's file: held to the per-file cap, not counted among the artifacts."""
        data = tar.extractfile(member)
        if data is None:
            return
        if name == RICH_INDEX:
            self.rich_index = data.read(RESULT_CAP_BYTES + 1)[:RESULT_CAP_BYTES]
            return
        file = name[len(RICH_DIR) :]
        if "/" in file or not safe_name(file) or member.size > self.caps.file_bytes:
            self.not_kept.append({"name": f"result {file}", "size": member.size, "reason": "result larger than the "
                                  f"per-file cap {self.caps.file_bytes} bytes or badly named"})  # fmt: skip
            return
        try:
            size, digest = self.store.put(self.execution_id, name, data, member.size)
        except ArtifactTooLarge:
            return
        self.rich[file] = KeptArtifact(name, size, digest, mimetypes.guess_type(file)[0] or "application/octet-stream")

    def _read_result(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        if not member.isreg() or member.size > RESULT_CAP_BYTES:
            self.skipped.append({"name": RESULT_FILE, "reason": "result file not a regular file or too large"})
            return
        data = tar.extractfile(member)
        self.result = data.read() if data is not None else None
