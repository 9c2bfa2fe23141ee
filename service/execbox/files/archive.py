"""Input files as the engine takes them: one tar for its archive API."""

from __future__ import annotations

import io
import tarfile
import time

from execbox.files.schemas import InputFileRef
from execbox.files.store import FileStore


def input_archive(files: FileStore, refs: list[InputFileRef]) -> bytes:
    """A tar of the input files for the engine's archive API.

    Files belong to root (mode 0644): the program reads them but, with the kernel's
    protected_hardlinks, cannot hard-link them into its output directory; directories are
    writable by anyone (the sandbox's own uid is chosen later, and it is alone in there) so it can
    still add files next to its inputs.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        made: set[str] = set()
        for ref in refs:
            # Streamed from its store, checked against the size and sha256 it was accepted with
            # (InputUnavailable when it is gone or differs).
            data = files.open(ref)
            parts = ref.path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    tar.addfile(_tar_entry(directory, tarfile.DIRTYPE, 0o777))
            tar.addfile(_tar_entry(ref.path, tarfile.REGTYPE, 0o644, ref.size), data)
            data.finish()
    return buffer.getvalue()


def _tar_entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.uid = info.gid = 0
    info.mtime = int(time.time())
    return info


__all__ = ["input_archive"]
