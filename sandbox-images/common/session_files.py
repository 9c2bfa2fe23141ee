"""A session's file ops (`fs`: stat, list, read, write, mkdir, remove, move), beneath the rules of
session_paths.py.
"""

from __future__ import annotations

import base64
import grp
import os
import pwd
import shutil
import stat

from session_paths import Emit, Json, Opened, OpError, clean, failure, makedirs, parent_of

CHUNK = 512 * 1024


def _entry(parent_fd: int, name: str, path: str) -> Json:
    """What a listing or stat says of one entry (not following a symlink)."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    target: str | None = None
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = None
    return {"name": os.path.basename(path) or "/", "path": path, "type": kind, "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode), "perm": stat.filemode(st.st_mode), "owner": _user(st.st_uid),
            "group": _group(st.st_gid), "mtime": st.st_mtime, "target": target}  # fmt: skip


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class Files:
    def __init__(self, emit: Emit) -> None:
        self.emit = emit

    def handle(self, request: Json) -> Json:
        call = request.get("call")
        path = clean(request.get("path"))
        if call == "stat":
            if path == "/":
                raise OpError("invalid", "/: not available")
            parent, name = parent_of(path, False)
            with parent:
                try:
                    return {"entry": _entry(parent.fd, name, path)}
                except OSError as exc:
                    raise failure(exc, path) from None
        if call == "list":
            depth = request.get("depth", 1)
            depth = depth if isinstance(depth, int) and 1 <= depth <= 16 else 1
            found: list[Json] = []
            self._list(path, depth, found)
            return {"entries": found}
        if call == "read":
            return self._read(request, path)
        if call == "write":
            return self._write(request, path)
        if call == "mkdir":
            return {"made": makedirs(path)}
        if call == "remove":
            parent, name = parent_of(path, True)
            with parent:
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(name, dir_fd=parent.fd)
                    else:
                        os.unlink(name, dir_fd=parent.fd)
                except OSError as exc:
                    raise failure(exc, path) from None
            return {}
        if call == "move":
            target = clean(request.get("to"))
            makedirs(os.path.dirname(target))
            source, name = parent_of(path, True)
            with source:
                destination, new = parent_of(target, True)
                with destination:
                    try:
                        os.rename(name, new, src_dir_fd=source.fd, dst_dir_fd=destination.fd)
                        return {"entry": _entry(destination.fd, new, target)}
                    except OSError as exc:
                        raise failure(exc, path) from None
        raise OpError("invalid", f"unknown file call {call!r}")

    def _list(self, path: str, depth: int, found: list[Json]) -> None:
        with Opened(path, os.O_RDONLY | os.O_DIRECTORY, False) as opened:
            names = sorted(os.listdir(opened.fd))
            for name in names[: 10000 - len(found)]:
                child = path.rstrip("/") + "/" + name
                try:
                    entry = _entry(opened.fd, name, child)
                except OSError:
                    continue
                found.append(entry)
                if depth > 1 and entry["type"] == "dir" and len(found) < 10000:
                    try:
                        self._list(child, depth - 1, found)
                    except OpError:
                        continue

    def _read(self, request: Json, path: str) -> Json:
        limit = request.get("limit")
        limit = limit if isinstance(limit, int) and limit > 0 else 1 << 20
        with Opened(path, os.O_RDONLY | os.O_NONBLOCK, False) as opened:
            st = os.fstat(opened.fd)
            if stat.S_ISDIR(st.st_mode):
                raise OpError("invalid", f"{path}: is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise OpError("invalid", f"{path}: not a regular file")
            if st.st_size > limit:
                raise OpError("too_large", f"{path}: {st.st_size} bytes, more than the {limit} this interface reads")
            total = 0
            while True:
                data = os.read(opened.fd, min(CHUNK, limit + 1 - total))
                if not data:
                    break
                total += len(data)
                if total > limit:
                    raise OpError("too_large", f"{path}: more than the {limit} bytes this interface reads")
                self.emit({"ev": "chunk", "id": request.get("id"), "b": base64.b64encode(data).decode()})
            return {"size": total}

    def _write(self, request: Json, path: str) -> Json:
        try:
            data = base64.b64decode(request.get("b") or "", validate=True)
        except ValueError:
            raise OpError("invalid", "the content is not base64") from None
        makedirs(os.path.dirname(path))
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK
        with Opened(path, flags, True) as opened:
            if not stat.S_ISREG(os.fstat(opened.fd).st_mode):
                raise OpError("invalid", f"{path}: not a regular file")
            try:
                os.ftruncate(opened.fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(opened.fd, view) :]
            except OSError as exc:
                raise failure(exc, path) from None
            parent, name = parent_of(path, True)
            with parent:
                return {"entry": _entry(parent.fd, name, path)}
