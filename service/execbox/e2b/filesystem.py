"""envd's filesystem.Filesystem RPCs and its /files read and write, over the sandbox's file calls.

Entries come back in E2B's EntryInfo (proto3 JSON: enum names, int64 sizes as strings, RFC 3339
times, paths as the client calls them). Watchers are execbox.e2b.watchers'."""

from __future__ import annotations

import base64
import zlib
from datetime import UTC, datetime
from typing import Any

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.e2b.envd import Envd, e2b_path, sandbox_path
from execbox.e2b.errors import FileExists, FileTooLarge, NotOffered
from execbox.e2b.sandboxes import Opened

TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}


def entry_info(entry: dict[str, Any]) -> dict[str, Any]:
    """The sandbox's description of a file (session_ops.py's `_entry`) as E2B's EntryInfo."""
    info: dict[str, Any] = {
        "name": str(entry.get("name", "")),
        "type": TYPES.get(str(entry.get("type")), "FILE_TYPE_UNSPECIFIED"),
        "path": e2b_path(str(entry.get("path", ""))),
        "size": str(int(entry.get("size") or 0)),
        "mode": int(entry.get("mode") or 0),
        "permissions": str(entry.get("perm", "")),
        "owner": str(entry.get("owner", "")),
        "group": str(entry.get("group", "")),
    }
    mtime = entry.get("mtime")
    if isinstance(mtime, int | float):
        info["modifiedTime"] = datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")
    if entry.get("type") == "symlink":
        info["symlinkTarget"] = str(entry.get("target") or "")
        info["isSymlink"] = True
    return info


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} is required", (FieldProblem(name, "a path (string)"),))
    return sandbox_path(value, name)


async def rpc(envd: Envd, opened: Opened, method: str, body: dict[str, Any]) -> dict[str, Any]:
    """One unary filesystem.Filesystem call."""
    if method == "Stat":
        ok, _ = await envd.ask(opened, {"op": "fs", "call": "stat", "path": _field(body, "path")})
        return {"entry": entry_info(ok.get("entry") or {})}
    if method == "ListDir":
        depth = body.get("depth") or 1
        if not isinstance(depth, int | str) or str(depth) not in {str(n) for n in range(1, 17)}:
            raise InvalidRequest("bad depth", (FieldProblem("depth", "a depth from 1 to 16"),))
        ok, _ = await envd.ask(opened, {"op": "fs", "call": "list", "path": _field(body, "path"), "depth": int(depth)})
        return {"entries": [entry_info(e) for e in ok.get("entries") or [] if isinstance(e, dict)]}
    if method == "MakeDir":
        path = _field(body, "path")
        ok, _ = await envd.ask(opened, {"op": "fs", "call": "mkdir", "path": path})
        if not ok.get("made"):
            raise FileExists(f"{e2b_path(path)} already exists")
        ok, _ = await envd.ask(opened, {"op": "fs", "call": "stat", "path": path})
        return {"entry": entry_info(ok.get("entry") or {})}
    if method == "Move":
        request = {"op": "fs", "call": "move", "path": _field(body, "source"), "to": _field(body, "destination")}
        ok, _ = await envd.ask(opened, request)
        return {"entry": entry_info(ok.get("entry") or {})}
    if method == "Remove":
        await envd.ask(opened, {"op": "fs", "call": "remove", "path": _field(body, "path")})
        return {}
    raise NotOffered(f"no filesystem call {method[:64]!r}")


async def read(envd: Envd, opened: Opened, path: str | None) -> bytes:
    """GET /files: the file's bytes."""
    if path is None:
        raise InvalidRequest("path is required", (FieldProblem("path", "the file to read"),))
    request = {"op": "fs", "call": "read", "path": sandbox_path(path), "limit": envd.max_file_bytes}
    _, data = await envd.ask(opened, request)
    return data


async def write(envd: Envd, opened: Opened, files: list[tuple[str, bytes]]) -> list[dict[str, str]]:
    """POST /files: each (path, bytes) written whole (parents made), as E2B's list of written files."""
    if not files:
        raise InvalidRequest("no file", (FieldProblem("file", "send at least one file part"),))
    paths = [sandbox_path(path, "file") for path, _ in files]
    if len(set(paths)) != len(paths):
        raise InvalidRequest("the same path twice", (FieldProblem("file", "each path once per request"),))
    for path, (_, data) in zip(paths, files, strict=True):  # all checked before any is written
        if len(data) > envd.max_file_bytes:
            raise FileTooLarge(f"{e2b_path(path)}: {len(data)} bytes, more than the {envd.max_file_bytes} allowed")
    written = []
    for path, (_, data) in zip(paths, files, strict=True):
        ok, _ = await envd.ask(
            opened, {"op": "fs", "call": "write", "path": path, "b": base64.b64encode(data).decode()}
        )
        entry = ok.get("entry") or {}
        written.append({"name": str(entry.get("name", "")), "type": "file", "path": e2b_path(path)})
    return written


def gunzip(data: bytes, limit: int) -> bytes:
    """A gzip body, refused once it would grow past `limit` (no decompression bomb)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise InvalidRequest("bad gzip", (FieldProblem("body", "not gzip data"),)) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise FileTooLarge(f"the file unpacks to more than the {limit} bytes allowed")
    if not inflater.eof or inflater.unused_data:
        why = "one whole gzip member: this one ends early, or more follows it"
        raise InvalidRequest("bad gzip", (FieldProblem("body", why),))
    return out


__all__ = ["entry_info", "gunzip", "read", "rpc", "write"]
