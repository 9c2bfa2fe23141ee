"""Where artifacts live between the worker that collected them and the client that downloads them.

ArtifactStore is the seam; LocalArtifactStore keeps them in a directory (a volume in a container
stack) that API and workers share. Stored file names are hashes of the artifact's name, so no name
a program chose ever becomes part of a host path. An S3-compatible store implements the same four
methods.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

_CHUNK = 1 << 16


class ArtifactTooLarge(Exception):
    """The data passed the size it was announced (or allowed) to have."""


class ArtifactStore(Protocol):
    def put(self, execution_id: str, name: str, data: IO[bytes], limit: int) -> tuple[int, str]:
        """Store at most `limit` bytes; return (size, sha256 hex). Raises ArtifactTooLarge past it."""

    def read(self, execution_id: str, name: str) -> Iterator[bytes]:
        """The stored bytes in chunks; FileNotFoundError when absent."""

    def size(self, execution_id: str, name: str) -> int:
        """Stored size; FileNotFoundError when absent."""

    def delete_older_than(self, cutoff: float) -> int:
        """Remove every execution's artifacts stored before `cutoff` (Unix time); return how many executions."""


def _key(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()


class LocalArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, execution_id: str) -> Path:
        if not execution_id.isalnum() and not execution_id.replace("_", "").isalnum():
            raise ValueError(f"bad execution id {execution_id!r}")
        return self.root / execution_id

    def put(self, execution_id: str, name: str, data: IO[bytes], limit: int) -> tuple[int, str]:
        directory = self._dir(execution_id)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / _key(name)
        partial = target.with_suffix(".part")
        digest = hashlib.sha256()
        size = 0
        with open(partial, "wb") as out:
            while chunk := data.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    out.close()
                    partial.unlink()
                    raise ArtifactTooLarge(name)
                digest.update(chunk)
                out.write(chunk)
        os.replace(partial, target)
        return size, digest.hexdigest()

    def read(self, execution_id: str, name: str) -> Iterator[bytes]:
        with open(self._dir(execution_id) / _key(name), "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk

    def size(self, execution_id: str, name: str) -> int:
        return (self._dir(execution_id) / _key(name)).stat().st_size

    def delete_older_than(self, cutoff: float) -> int:
        removed = 0
        if not self.root.is_dir():
            return 0
        for entry in self.root.iterdir():
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        return removed
