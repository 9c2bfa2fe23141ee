"""The files room's Redis keys: uploaded and inline input files."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "file:{id}",
        "hash (meta, blob, data)",
        "file ttl, extended by executions using it",
        ("api",),
        ("worker",),
        "an uploaded or inline input file: meta, where its data is (`blob`), the data itself when in Redis",
    ),
)


class FileKeys(KeyBuilder):
    def file(self, file_id: str) -> str:
        return self._k("file", file_id)


__all__ = ["SCHEMA", "FileKeys"]
