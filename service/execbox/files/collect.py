"""Collect what a program left in its output directory from the engine's tar stream.

Only regular files are kept; symlinks, hard links, devices and FIFOs are listed as skipped and
never read (so no link can make the worker return a file from outside the directory). Names are
checked before anything is stored, and the store never builds a host path from them. Caps on
count, per-file and total size are applied before a member's bytes are read; whatever passes a
cap is listed as not kept, never dropped silently.
"""

from __future__ import annotations

import fnmatch
import io
import mimetypes
import tarfile
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

    def __call__(self, chunks: Iterator[bytes]) -> None:
        total = 0
        with tarfile.open(fileobj=io.BufferedReader(_StreamReader(chunks), 1 << 16), mode="r|") as tar:
            for member in tar:
                name = self._relative(member.name)
                if name is None or member.isdir():
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
                    self.skipped.append(
                        {"name": name.encode("utf-8", "backslashreplace").decode(), "reason": "unsafe_name"}
                    )
                    continue
                if not member.isreg():
                    kind = "symlink" if member.issym() else "hardlink" if member.islnk() else "not_a_file"
                    self.skipped.append({"name": name, "reason": kind})
                    continue
                over = self._cap_reason(member.size, total)
                if over:
                    self.over_cap = True
                    self.not_kept.append({"name": name, "size": member.size, "reason": over})
                    continue
                data = tar.extractfile(member)
                assert data is not None  # a regular member always has data
                try:
                    size, digest = self.store.put(self.execution_id, name, data, member.size)
                except ArtifactTooLarge:
                    self.skipped.append({"name": name, "reason": "changed_while_read"})
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
