"""The paths a session's file and watcher ops may reach (session_ops.py serves them).

Paths. Everything that changes the filesystem stays in the workspace's tree: the path is resolved by
the kernel beneath an fd of /workspace (openat2 with RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS), so
no `..`, absolute symlink or /proc link a cell planted leads out of it. Reads, listings and stats
may also look at the rest of the image (read-only), never at /proc, /sys or /dev: the file
actually opened is checked, not the name asked for. This matters beyond tidiness: this process's
stdout is the worker's channel, and a write that reached /proc/self/fd/1 would let whoever chose
the path speak for the supervisor. Only regular files are read or written (opened non-blocking:
a FIFO a cell left where a file was expected cannot stall the supervisor).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import Any

WORKDIR = "/workspace"
HIDDEN = ("/proc", "/sys", "/dev")
"""Never read, listed or stat'ed: the supervisor's own fds and the kernel's interfaces live there."""
SYS_OPENAT2 = 437  # the same number on every architecture Linux has added it to
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100
Json = dict[str, Any]
"""A request, an answer or an event of the ops' wire (one JSON object)."""
Emit = Callable[[Json], None]
"""Where the ops send their answers and events (the supervisor's stdout)."""


class OpError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class _How(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    how = _How(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)  # openat2 wants no stray mode
    fd: int = _libc.syscall(SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def failure(exc: OSError, path: str) -> OpError:
    """An OSError as the answer's error."""
    kinds = {errno.ENOENT: "not_found", errno.ENOTDIR: "not_found", errno.EEXIST: "exists",
             errno.ENOTEMPTY: "exists", errno.EXDEV: "invalid", errno.ELOOP: "invalid",
             errno.EISDIR: "invalid", errno.EACCES: "invalid", errno.EPERM: "invalid", errno.EROFS: "invalid",
             errno.ENOSPC: "too_large", errno.EDQUOT: "too_large", errno.ENXIO: "invalid"}  # fmt: skip
    what = {errno.EXDEV: "leads outside the workspace or through a link that may not be followed",
            errno.ELOOP: "leads outside the workspace or through a link that may not be followed",
            errno.ENXIO: "not a regular file (a FIFO or socket with no reader, or a device)"}  # fmt: skip
    code = exc.errno or 0
    return OpError(kinds.get(code, "failed"), f"{path}: {what.get(code, exc.strerror)}")


def clean(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or len(path) > 4096:
        raise OpError("invalid", "a path must be absolute, without NUL, at most 4096 characters")
    return os.path.normpath(path).replace("//", "/")


def inside(path: str) -> bool:
    return path == WORKDIR or path.startswith(WORKDIR + "/")


class Opened:
    """An fd for a path, resolved safely: beneath the workspace, or (reads only) elsewhere but never
    in HIDDEN. Closed on exit."""

    def __init__(self, path: str, flags: int, write: bool, mode: int = 0o644) -> None:
        path = clean(path)
        self.root: int | None
        if inside(path):
            self.root = os.open(WORKDIR, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            relative = os.path.relpath(path, WORKDIR)
            try:
                self.fd = openat2(self.root, relative, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
            except OSError as exc:
                os.close(self.root)
                raise failure(exc, path) from None
        else:
            if write:
                raise OpError("invalid", f"{path}: only the workspace ({WORKDIR}) can be changed")
            self.root = None
            try:
                self.fd = openat2(AT_FDCWD, path, flags, mode, RESOLVE_NO_MAGICLINKS)
            except OSError as exc:
                raise failure(exc, path) from None
            real = os.readlink(f"/proc/self/fd/{self.fd}")
            if any(real == top or real.startswith(top + "/") for top in HIDDEN):
                self.close()
                raise OpError("invalid", f"{path}: not readable through this interface")
        self.path = path

    def close(self) -> None:
        for fd in (self.fd, self.root):
            if fd is not None:
                os.close(fd)

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parent_of(path: str, write: bool) -> tuple[Opened, str]:
    parent, name = os.path.split(path)
    if not name or (write and path == WORKDIR):
        raise OpError("invalid", f"{path}: not a file or directory that can be changed")
    return Opened(parent, os.O_PATH | os.O_DIRECTORY, write), name


def makedirs(path: str) -> bool:
    """mkdir -p beneath the workspace; True when the last one was made here."""
    path = clean(path)
    if not inside(path) or path == WORKDIR:
        if path == WORKDIR:
            return False
        raise OpError("invalid", f"{path}: only the workspace ({WORKDIR}) can be changed")
    made = False
    current = WORKDIR
    for part in os.path.relpath(path, WORKDIR).split("/"):
        with Opened(current, os.O_PATH | os.O_DIRECTORY, True) as parent:
            try:
                os.mkdir(part, 0o755, dir_fd=parent.fd)
                made = True
            except FileExistsError:
                made = False
            except OSError as exc:
                raise failure(exc, current + "/" + part) from None
        current = current + "/" + part
    with Opened(current, os.O_PATH | os.O_DIRECTORY, True):  # what exists there must be a directory
        pass
    return made
