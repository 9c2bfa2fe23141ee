"""A session's directory watchers (`watch.start`, `watch.stop`; inotify)."""

from __future__ import annotations

import ctypes
import os
import struct

from session_paths import Emit, Json, Opened, OpError, clean, failure

MAX_WATCHERS = 16
MAX_WATCHED_DIRS = 4096
"""Directories all watchers follow at most (a recursive watch of a large tree stops there)."""
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = (
    0x100,
    0x200,
    0x4000,
    0x8000,
    0x1000000,
    0x40000000,
)
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
EVENT_TYPES = ((IN_CREATE | IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_DELETE, "remove"),
               (IN_MOVED_FROM, "rename"), (IN_ATTRIB, "chmod"))  # fmt: skip


class Watchers:
    """Directory watchers on one inotify instance (made on the first watch). A directory's watch
    descriptor may serve several watchers; each knows it by the directory's path relative to its
    own top."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.fd: int | None = None
        self.libc: ctypes.CDLL | None = None
        self.tops: dict[object, bool] = {}
        """A watcher's id -> whether it is recursive."""
        self.dirs: dict[int, tuple[str, dict[object, str]]] = {}
        """A watch descriptor -> (the directory's real path, {watcher id: its path relative to that watcher's top})."""

    def watched(self) -> list[int]:
        return [] if self.fd is None else [self.fd]

    def handle(self, request: Json) -> Json:
        if request.get("op") == "watch.stop":
            watcher = request.get("watch")
            if watcher not in self.tops:
                raise OpError("not_found", f"no watcher {watcher!r}")
            self._stop(watcher)
            return {}
        ident = request.get("id")
        if len(self.tops) >= MAX_WATCHERS:
            raise OpError("too_large", f"{MAX_WATCHERS} directory watchers already: stop one first")
        if self.fd is None:
            self.libc = ctypes.CDLL(None, use_errno=True)
            fd: int = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OpError("failed", f"inotify: {os.strerror(ctypes.get_errno())}")
            self.fd = fd
        recursive = request.get("recursive") is True
        path = clean(request.get("path"))
        self.tops[ident] = recursive
        try:
            self._add(ident, path, "", recursive)
        except BaseException:
            self._stop(ident)
            raise
        return {}

    def _add(
        self, watcher: object, path: str, relative: str, recursive: bool, found: dict[object, list[Json]] | None = None
    ) -> None:
        """Watch the directory at path (resolved as any read is) for watcher; its subdirectories too.
        With `found` (a directory made under a recursive watch), what is in it already is reported
        as made: it may have been filled before its own watch was added."""
        with Opened(path, os.O_RDONLY | os.O_DIRECTORY, False) as opened:
            if len(self.dirs) >= MAX_WATCHED_DIRS:
                raise OpError("too_large", f"{path}: more than {MAX_WATCHED_DIRS} directories watched")
            real = os.readlink(f"/proc/self/fd/{opened.fd}")
            assert self.libc is not None, "made with the inotify instance"
            wd: int = self.libc.inotify_add_watch(self.fd, (f"/proc/self/fd/{opened.fd}").encode(), WATCH_MASK)
            if wd < 0:
                raise failure(OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno())), path)
            self.dirs.setdefault(wd, (real, {}))[1][watcher] = relative
            if recursive:
                for entry in os.scandir(opened.fd):
                    if found is not None:
                        found.setdefault(watcher, []).append({"name": relative + entry.name, "type": "create"})
                    if entry.is_dir(follow_symlinks=False):
                        prefix = relative + entry.name + "/"
                        self._add(watcher, real.rstrip("/") + "/" + entry.name, prefix, True, found)

    def _stop(self, watcher: object) -> None:
        self.tops.pop(watcher, None)
        for wd, (_, watchers) in list(self.dirs.items()):
            watchers.pop(watcher, None)
            if not watchers:
                del self.dirs[wd]
                assert self.libc is not None, "made with the inotify instance"
                self.libc.inotify_rm_watch(self.fd, wd)

    def readable(self, fd: int) -> bool:
        """Report what inotify has read; False when fd is not its."""
        if fd != self.fd or fd is None:
            return False
        found: dict[object, list[Json]] = {}
        try:
            while True:
                data = os.read(fd, 1 << 16)
                offset = 0
                while offset + 16 <= len(data):
                    wd, mask, _, size = struct.unpack_from("iIII", data, offset)
                    name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                    offset += 16 + size
                    self._event(wd, mask, name, found)
        except BlockingIOError:
            pass
        for watcher, events in found.items():
            for start in range(0, len(events), 512):
                self.emit({"ev": "wev", "id": watcher, "events": events[start : start + 512]})
        return True

    def _event(self, wd: int, mask: int, name: str, found: dict[object, list[Json]]) -> None:
        if mask & IN_IGNORED:  # the directory went away (or was unwatched)
            self.dirs.pop(wd, None)
            return
        entry = self.dirs.get(wd)
        if entry is None or not name:
            return
        real, watchers = entry
        kind = next((word for bit, word in EVENT_TYPES if mask & bit), None)
        if kind is None:
            return
        for watcher, relative in list(watchers.items()):
            found.setdefault(watcher, []).append({"name": relative + name, "type": kind})
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and self.tops.get(watcher):
                try:
                    self._add(watcher, real.rstrip("/") + "/" + name, relative + name + "/", True, found)
                except Exception:  # gone already, past the cap, too deep: its own events are not followed
                    pass
