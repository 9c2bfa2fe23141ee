"""Files and processes of a session's sandbox, served by its supervisor (session.py) beside the cells.

The worker asks on the supervisor's stdin, one JSON object per line, each with an "id" of its own:

    {"op": "fs", "id", "call": "stat"|"list"|"read"|"write"|"mkdir"|"remove"|"move",
     "path", "to" (move), "depth" (list), "b" (write, base64), "limit" (read, bytes)}
    {"op": "proc.start", "id", "argv": [...], "env": {...}, "cwd", "stdin": bool, "tag",
     "timeout_s" (its lifetime: killed then; null for none), "pty": {"rows", "cols"} (optional: on
     a pseudo-terminal, whose output is fd 3 and to which proc.input types)}
    {"op": "proc.resize", "id", "pid", "rows", "cols"}   (a pseudo-terminal's size)
    {"op": "proc.input", "id", "pid", "b"}     {"op": "proc.close", "id", "pid"}   (stdin)
    {"op": "proc.signal", "id", "pid", "sig"}  {"op": "proc.list", "id"}
    {"op": "watch.start", "id", "path", "recursive": bool}   {"op": "watch.stop", "id", "watch"}

and each gets one answer, {"ev": "reply", "id", "ok": {...}} or {"ev": "reply", "id", "error":
{"kind": "not_found"|"exists"|"invalid"|"too_large"|"failed", "message"}}; a read's bytes come
first as {"ev": "chunk", "id", "b"} events (so that no line is large). A started process then
reports on its own: {"ev": "pout", "pid", "fd": 1|2, "b"} while it writes, and {"ev": "pend",
"pid", "status", "signal"} once it has ended (its exit status, or the signal that ended it). A
directory watcher (its id is the id of the watch.start that made it) reports what changes under it
as {"ev": "wev", "id", "events": [{"name": path relative to the watched directory, "type":
"create"|"write"|"remove"|"rename"|"chmod"}]} until watch.stop (inotify; a recursive watcher
follows the directories made under it).

Paths. Everything that changes the filesystem stays in the workspace's tree: the path is resolved by
the kernel beneath an fd of /workspace (openat2 with RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS), so
no `..`, absolute symlink or /proc link a cell planted leads out of it. Reads, listings and stats
may also look at the rest of the image (read-only), never at /proc, /sys or /dev: the file
actually opened is checked, not the name asked for. This matters beyond tidiness: this process's
stdout is the worker's channel, and a write that reached /proc/self/fd/1 would let whoever chose
the path speak for the supervisor. Only regular files are read or written (opened non-blocking:
a FIFO a cell left where a file was expected cannot stall the supervisor).

Processes run as the sandbox's user, each in a session of its own (its pid is its session id), with
the session's environment plus the request's. They are not a cell's leftovers: the sweep after
each cell spares every process of such a session (see `spared`). A kernel restart (kill -1) ends
them with everything else, and each reports its end.
"""

import base64
import ctypes
import errno
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import stat
import struct
import termios
import time

WORKDIR = "/workspace"
HIDDEN = ("/proc", "/sys", "/dev")
"""Never read, listed or stat'ed: the supervisor's own fds and the kernel's interfaces live there."""
CHUNK = 512 * 1024
MAX_PROCS = 32
MAX_INPUT = 1 << 20
SYS_OPENAT2 = 437  # the same number on every architecture Linux has added it to
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100
MAX_WATCHERS = 16
MAX_WATCHED_DIRS = 4096
"""Directories all watchers follow at most (a recursive watch of a large tree stops there)."""
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x100, 0x200, 0x4000, 0x8000, 0x1000000, 0x40000000
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
EVENT_TYPES = ((IN_CREATE | IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_DELETE, "remove"),
               (IN_MOVED_FROM, "rename"), (IN_ATTRIB, "chmod"))  # fmt: skip
REPLY_CAP = 768 * 1024
"""The longest reply line (the worker reads lines of 1 MiB at most and loses a session that sends a
longer one): a larger answer is refused as too_large, saying how to ask for less."""
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGHUP": signal.SIGHUP}


class OpError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind, self.message = kind, message


class _How(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _openat2(dirfd, path, flags, mode, resolve):
    how = _How(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)  # openat2 wants no stray mode
    fd = _libc.syscall(SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _failure(exc, path):
    """An OSError as the answer's error."""
    kinds = {errno.ENOENT: "not_found", errno.ENOTDIR: "not_found", errno.EEXIST: "exists",
             errno.ENOTEMPTY: "exists", errno.EXDEV: "invalid", errno.ELOOP: "invalid",
             errno.EISDIR: "invalid", errno.EACCES: "invalid", errno.EPERM: "invalid", errno.EROFS: "invalid",
             errno.ENOSPC: "too_large", errno.EDQUOT: "too_large", errno.ENXIO: "invalid"}  # fmt: skip
    what = {errno.EXDEV: "leads outside the workspace or through a link that may not be followed",
            errno.ELOOP: "leads outside the workspace or through a link that may not be followed",
            errno.ENXIO: "not a regular file (a FIFO or socket with no reader, or a device)"}  # fmt: skip
    return OpError(kinds.get(exc.errno, "failed"), "%s: %s" % (path, what.get(exc.errno, exc.strerror)))


def _clean(path):
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or len(path) > 4096:
        raise OpError("invalid", "a path must be absolute, without NUL, at most 4096 characters")
    return os.path.normpath(path).replace("//", "/")


def _inside(path):
    return path == WORKDIR or path.startswith(WORKDIR + "/")


class _Opened:
    """An fd for a path, resolved safely: beneath the workspace, or (reads only) elsewhere but never
    in HIDDEN. Closed on exit."""

    def __init__(self, path, flags, write, mode=0o644):
        path = _clean(path)
        if _inside(path):
            self.root = os.open(WORKDIR, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            relative = os.path.relpath(path, WORKDIR)
            try:
                self.fd = _openat2(self.root, relative, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
            except OSError as exc:
                os.close(self.root)
                raise _failure(exc, path) from None
        else:
            if write:
                raise OpError("invalid", "%s: only the workspace (%s) can be changed" % (path, WORKDIR))
            self.root = None
            try:
                self.fd = _openat2(AT_FDCWD, path, flags, mode, RESOLVE_NO_MAGICLINKS)
            except OSError as exc:
                raise _failure(exc, path) from None
            real = os.readlink("/proc/self/fd/%d" % self.fd)
            if any(real == top or real.startswith(top + "/") for top in HIDDEN):
                self.close()
                raise OpError("invalid", "%s: not readable through this interface" % path)
        self.path = path

    def close(self):
        for fd in (self.fd, self.root):
            if fd is not None:
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _entry(parent_fd, name, path):
    """What a listing or stat says of one entry (not following a symlink)."""
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    target = None
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = None
    return {"name": os.path.basename(path) or "/", "path": path, "type": kind, "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode), "perm": stat.filemode(st.st_mode), "owner": _user(st.st_uid),
            "group": _group(st.st_gid), "mtime": st.st_mtime, "target": target}  # fmt: skip


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _parent_of(path, write):
    parent, name = os.path.split(path)
    if not name or (write and path == WORKDIR):
        raise OpError("invalid", "%s: not a file or directory that can be changed" % path)
    return _Opened(parent, os.O_PATH | os.O_DIRECTORY, write), name


def _makedirs(path):
    """mkdir -p beneath the workspace; True when the last one was made here."""
    path = _clean(path)
    if not _inside(path) or path == WORKDIR:
        if path == WORKDIR:
            return False
        raise OpError("invalid", "%s: only the workspace (%s) can be changed" % (path, WORKDIR))
    made = False
    current = WORKDIR
    for part in os.path.relpath(path, WORKDIR).split("/"):
        with _Opened(current, os.O_PATH | os.O_DIRECTORY, True) as parent:
            try:
                os.mkdir(part, 0o755, dir_fd=parent.fd)
                made = True
            except FileExistsError:
                made = False
            except OSError as exc:
                raise _failure(exc, current + "/" + part) from None
        current = current + "/" + part
    with _Opened(current, os.O_PATH | os.O_DIRECTORY, True):  # what exists there must be a directory
        pass
    return made


class Files:
    def __init__(self, emit):
        self.emit = emit

    def handle(self, request):
        call = request.get("call")
        path = _clean(request.get("path"))
        if call == "stat":
            parent, name = _parent_of(path, False) if path != "/" else (None, None)
            if parent is None:
                raise OpError("invalid", "/: not available")
            with parent:
                try:
                    return {"entry": _entry(parent.fd, name, path)}
                except OSError as exc:
                    raise _failure(exc, path) from None
        if call == "list":
            depth = request.get("depth", 1)
            depth = depth if isinstance(depth, int) and 1 <= depth <= 16 else 1
            found = []
            self._list(path, depth, found)
            return {"entries": found}
        if call == "read":
            return self._read(request, path)
        if call == "write":
            return self._write(request, path)
        if call == "mkdir":
            return {"made": _makedirs(path)}
        if call == "remove":
            parent, name = _parent_of(path, True)
            with parent:
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(name, dir_fd=parent.fd)
                    else:
                        os.unlink(name, dir_fd=parent.fd)
                except OSError as exc:
                    raise _failure(exc, path) from None
            return {}
        if call == "move":
            target = _clean(request.get("to"))
            _makedirs(os.path.dirname(target))
            source, name = _parent_of(path, True)
            with source:
                destination, new = _parent_of(target, True)
                with destination:
                    try:
                        os.rename(name, new, src_dir_fd=source.fd, dst_dir_fd=destination.fd)
                        return {"entry": _entry(destination.fd, new, target)}
                    except OSError as exc:
                        raise _failure(exc, path) from None
        raise OpError("invalid", "unknown file call %r" % (call,))

    def _list(self, path, depth, found):
        with _Opened(path, os.O_RDONLY | os.O_DIRECTORY, False) as opened:
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

    def _read(self, request, path):
        limit = request.get("limit")
        limit = limit if isinstance(limit, int) and limit > 0 else 1 << 20
        with _Opened(path, os.O_RDONLY | os.O_NONBLOCK, False) as opened:
            st = os.fstat(opened.fd)
            if stat.S_ISDIR(st.st_mode):
                raise OpError("invalid", "%s: is a directory" % path)
            if not stat.S_ISREG(st.st_mode):
                raise OpError("invalid", "%s: not a regular file" % path)
            if st.st_size > limit:
                raise OpError("too_large", "%s: %d bytes, more than the %d this interface reads" % (path, st.st_size, limit))
            total = 0
            while True:
                data = os.read(opened.fd, min(CHUNK, limit + 1 - total))
                if not data:
                    break
                total += len(data)
                if total > limit:
                    raise OpError("too_large", "%s: more than the %d bytes this interface reads" % (path, limit))
                self.emit({"ev": "chunk", "id": request.get("id"), "b": base64.b64encode(data).decode()})
            return {"size": total}

    def _write(self, request, path):
        try:
            data = base64.b64decode(request.get("b") or "", validate=True)
        except ValueError:
            raise OpError("invalid", "the content is not base64") from None
        _makedirs(os.path.dirname(path))
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK
        with _Opened(path, flags, True) as opened:
            if not stat.S_ISREG(os.fstat(opened.fd).st_mode):
                raise OpError("invalid", "%s: not a regular file" % path)
            try:
                os.ftruncate(opened.fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(opened.fd, view) :]
            except OSError as exc:
                raise _failure(exc, path) from None
            parent, name = _parent_of(path, True)
            with parent:
                return {"entry": _entry(parent.fd, name, path)}


class Process:
    def __init__(self, pid, request, stdin, pipes):
        self.pid, self.stdin, self.pipes = pid, stdin, pipes
        self.pty = 3 in pipes.values()
        self.info = {"pid": pid, "tag": request.get("tag"), "argv": request["argv"], "env": request.get("env") or {},
                     "cwd": request.get("cwd") or WORKDIR}  # fmt: skip
        timeout = request.get("timeout_s")
        self.deadline = time.monotonic() + timeout if isinstance(timeout, (int, float)) and timeout > 0 else None


def _child(argv, environ, cwd, stdio, terminal=None):
    """In a forked child: a session of its own (with `terminal` as its controlling one), stdio on the
    three fds given, nothing else open, then the program; never returns."""
    try:
        os.setsid()
        if terminal is not None:
            fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)
        for fd, target in zip(stdio, (0, 1, 2)):
            os.dup2(fd, target)
        os.closerange(3, 1024)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(cwd)
        os.execvpe(argv[0], argv, environ)
    except OSError as exc:
        os.write(2, ("%s: %s\n" % (argv[0], exc.strerror)).encode())
    finally:
        os._exit(127)


def _fork():
    """os.fork, its failure an answer (the sandbox's process limit reached, say by a fork bomb)."""
    try:
        return os.fork()
    except OSError as exc:
        raise OpError("failed", "no process could be started (%s): the sandbox's process limit is reached; "
                      "end some processes (proc.signal) and retry" % exc.strerror) from None  # fmt: skip


def _stat(pid):
    """(state, session id) of a process, None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _members(sid):
    """The live (not zombie) processes of session sid."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            seen = _stat(int(name))
            if seen is not None and seen[1] == sid and seen[0] != "Z":
                found.append(int(name))
    return found


def _signal_session(sid, sig):
    """Signal every process of a command's session (its process group is not enough: what it
    started may have made groups of its own). SIGKILL is repeated until none is left (one may
    fork while the others are killed); each is stopped first so that none forks past the kill."""
    if sig != signal.SIGKILL:
        for pid in _members(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return
    for attempt in range(100):
        members = _members(sid)
        if not members:
            return
        if attempt:
            time.sleep(0.002)  # the killed ones are still exiting
        for stop in (signal.SIGSTOP, signal.SIGKILL):
            for pid in members:
                try:
                    os.kill(pid, stop)
                except ProcessLookupError:
                    pass


def _size(request):
    """A terminal's (rows, cols) from {"rows", "cols"}."""
    rows, cols = (request or {}).get("rows"), (request or {}).get("cols")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 4096 for n in (rows, cols)):
        raise OpError("invalid", "a terminal's size is rows and cols from 1 to 4096")
    return rows, cols


class Processes:
    """The processes started on request, and their pipes."""

    def __init__(self, emit):
        self.emit = emit
        self.live = {}
        self.ended = {}
        """Processes whose leader has ended, by session id, while any member of the session is left:
        spared by the cell sweep, listed, signalable, and killed at the command's lifetime."""

    def watched(self):
        return [fd for proc in self.live.values() for fd in proc.pipes]

    def spared(self, sids):
        """The session ids the cell sweep must leave alone, given the sids of the processes alive."""
        for sid in list(self.ended):
            if sid not in sids:
                del self.ended[sid]
        return set(self.live) | set(self.ended)

    def _left(self):
        """Forget the ended commands whose sessions have no process left."""
        for sid in list(self.ended):
            if not _members(sid):
                del self.ended[sid]

    def handle(self, request):
        op = request.get("op")
        if op == "proc.list":
            self._left()
            left = [dict(proc.info, leader_ended=True) for proc in self.ended.values()]
            return {"processes": [proc.info for proc in self.live.values()] + left}
        if op == "proc.start":
            return self._start(request)
        proc = self.live.get(request.get("pid"))
        if proc is None and op == "proc.signal" and request.get("pid") in self.ended:
            if _members(request["pid"]):  # what its leader left running: still the command's
                proc = self.ended[request["pid"]]
            else:
                del self.ended[request["pid"]]
        if proc is None:
            raise OpError("not_found", "no running process %r" % (request.get("pid"),))
        if op == "proc.signal":
            sig = SIGNALS.get(request.get("sig"))
            if sig is None:
                raise OpError("invalid", "signal must be one of %s" % ", ".join(SIGNALS))
            _signal_session(proc.pid, sig)
            return {}
        if op == "proc.input":
            if proc.stdin is None:
                raise OpError("invalid", "process %d was started without stdin" % proc.pid)
            try:
                data = base64.b64decode(request.get("b") or "", validate=True)
            except ValueError:
                raise OpError("invalid", "the input is not base64") from None
            if len(data) > MAX_INPUT:
                raise OpError("too_large", "at most %d bytes of input at a time" % MAX_INPUT)
            try:
                written = os.write(proc.stdin, data) if data else 0
            except (BlockingIOError, BrokenPipeError):
                written = 0 if data else None
            if data and written != len(data):
                raise OpError("failed", "process %d is not reading its stdin (%d of %d bytes taken)" % (proc.pid, written or 0, len(data)))
            return {}
        if op == "proc.resize":
            if not proc.pty:
                raise OpError("invalid", "process %d has no pseudo-terminal" % proc.pid)
            rows, cols = _size(request)
            fcntl.ioctl(proc.stdin, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            return {}
        if op == "proc.close":
            if proc.pty:  # its input and output are one fd: closing it would hang the terminal up
                return {}
            if proc.stdin is not None:
                os.close(proc.stdin)
                proc.stdin = None
            return {}
        raise OpError("invalid", "unknown op %r" % (op,))

    def _start(self, request):
        argv, env, cwd = request.get("argv"), request.get("env") or {}, request.get("cwd") or WORKDIR
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise OpError("invalid", "argv must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise OpError("invalid", "env must map names to strings")
        if len(self.live) >= MAX_PROCS:
            raise OpError("too_large", "at most %d processes run at once in a sandbox" % MAX_PROCS)
        cwd = _clean(cwd)
        with _Opened(cwd, os.O_PATH | os.O_DIRECTORY, False):
            pass  # it exists, is a directory, and is not hidden
        environ = {**os.environ, **env, "PWD": cwd}  # the shell's pwd says the directory as it was asked
        if request.get("pty") is not None:
            return self._start_pty(request, argv, environ, cwd)
        stdin_r, stdin_w = os.pipe() if request.get("stdin") else (os.open(os.devnull, os.O_RDONLY), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = _fork()
        except OpError:
            for fd in (stdin_r, out_w, err_w, out_r, err_r, stdin_w):
                if fd is not None:
                    os.close(fd)
            raise
        if pid == 0:
            _child(argv, environ, cwd, (stdin_r, out_w, err_w))
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        for fd in (out_r, err_r) + ((stdin_w,) if stdin_w is not None else ()):
            os.set_inheritable(fd, False)
            os.set_blocking(fd, False)
        self.live[pid] = Process(pid, request, stdin_w, {out_r: 1, err_r: 2})
        return {"pid": pid}

    def _start_pty(self, request, argv, environ, cwd):
        """A process on a pseudo-terminal of its own (its controlling terminal): what it writes comes
        back as fd 3, what is sent to it is typed."""
        rows, cols = _size(request.get("pty"))
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        try:
            pid = _fork()
        except OpError:
            os.close(master)
            os.close(slave)
            raise
        if pid == 0:
            _child(argv, environ, cwd, (slave, slave, slave), terminal=slave)
        os.close(slave)
        os.set_inheritable(master, False)
        os.set_blocking(master, False)
        self.live[pid] = Process(pid, request, master, {master: 3})
        return {"pid": pid}

    def expire(self):
        """Kill the commands whose lifetime is over, and everything in their sessions (what they
        started in the background included, whether their leader has ended or not); an end is
        reported when its leader is reaped."""
        now = time.monotonic()
        for proc in [*self.live.values(), *self.ended.values()]:
            if proc.deadline is not None and now >= proc.deadline:
                proc.deadline = None
                _signal_session(proc.pid, signal.SIGKILL)

    def timed(self):
        """Whether any command still has a lifetime to enforce (the supervisor calls expire then)."""
        return bool(self.live) or any(proc.deadline is not None for proc in self.ended.values())

    def readable(self, fd):
        """Forward what a process wrote on fd; False when fd is none of theirs."""
        for proc in self.live.values():
            if fd in proc.pipes:
                self._forward(proc, fd)
                return True
        return False

    def _forward(self, proc, fd):
        try:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError as exc:  # a terminal whose process is gone says EIO, not end of file
                    if exc.errno != errno.EIO:
                        raise
                    data = b""
                if not data:
                    del proc.pipes[fd]
                    os.close(fd)
                    if proc.stdin == fd:
                        proc.stdin = None
                    return
                self.emit({"ev": "pout", "pid": proc.pid, "fd": proc.pipes[fd], "b": base64.b64encode(data).decode()})
        except BlockingIOError:
            return

    def reaped(self, pid, status):
        """A child ended; True when it was one of ours (its end is reported)."""
        proc = self.live.pop(pid, None)
        if proc is None:
            return False
        for fd in list(proc.pipes):
            self._forward(proc, fd)
            if fd in proc.pipes:
                os.close(fd)
                if proc.stdin == fd:  # a terminal: one fd both ways
                    proc.stdin = None
        if proc.stdin is not None:
            os.close(proc.stdin)
        self.ended[pid] = proc
        code = os.waitstatus_to_exitcode(status)
        self.emit({"ev": "pend", "pid": pid, "status": code if code >= 0 else 128 - code,
                   "signal": signal.Signals(-code).name if code < 0 else None})  # fmt: skip
        return True


class Watchers:
    """Directory watchers on one inotify instance (made on the first watch). A directory's watch
    descriptor may serve several watchers; each knows it by the directory's path relative to its
    own top."""

    def __init__(self, emit):
        self.emit = emit
        self.fd = None
        self.libc = None
        self.tops = {}
        """A watcher's id -> whether it is recursive."""
        self.dirs = {}
        """A watch descriptor -> (the directory's real path, {watcher id: its path relative to that watcher's top})."""

    def watched(self):
        return [] if self.fd is None else [self.fd]

    def handle(self, request):
        if request.get("op") == "watch.stop":
            watcher = request.get("watch")
            if watcher not in self.tops:
                raise OpError("not_found", "no watcher %r" % (watcher,))
            self._stop(watcher)
            return {}
        ident = request.get("id")
        if len(self.tops) >= MAX_WATCHERS:
            raise OpError("too_large", "%d directory watchers already: stop one first" % MAX_WATCHERS)
        if self.fd is None:
            self.libc = ctypes.CDLL(None, use_errno=True)
            fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                raise OpError("failed", "inotify: %s" % os.strerror(ctypes.get_errno()))
            self.fd = fd
        recursive = request.get("recursive") is True
        path = _clean(request.get("path"))
        self.tops[ident] = recursive
        try:
            self._add(ident, path, "", recursive)
        except BaseException:
            self._stop(ident)
            raise
        return {}

    def _add(self, watcher, path, relative, recursive, found=None):
        """Watch the directory at path (resolved as any read is) for watcher; its subdirectories too.
        With `found` (a directory made under a recursive watch), what is in it already is reported
        as made: it may have been filled before its own watch was added."""
        with _Opened(path, os.O_RDONLY | os.O_DIRECTORY, False) as opened:
            if len(self.dirs) >= MAX_WATCHED_DIRS:
                raise OpError("too_large", "%s: more than %d directories watched" % (path, MAX_WATCHED_DIRS))
            real = os.readlink("/proc/self/fd/%d" % opened.fd)
            wd = self.libc.inotify_add_watch(self.fd, ("/proc/self/fd/%d" % opened.fd).encode(), WATCH_MASK)
            if wd < 0:
                raise _failure(OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno())), path)
            self.dirs.setdefault(wd, (real, {}))[1][watcher] = relative
            if recursive:
                for entry in os.scandir(opened.fd):
                    if found is not None:
                        found.setdefault(watcher, []).append({"name": relative + entry.name, "type": "create"})
                    if entry.is_dir(follow_symlinks=False):
                        prefix = relative + entry.name + "/"
                        self._add(watcher, real.rstrip("/") + "/" + entry.name, prefix, True, found)

    def _stop(self, watcher):
        self.tops.pop(watcher, None)
        for wd, (_, watchers) in list(self.dirs.items()):
            watchers.pop(watcher, None)
            if not watchers:
                del self.dirs[wd]
                self.libc.inotify_rm_watch(self.fd, wd)

    def readable(self, fd):
        """Report what inotify has read; False when fd is not its."""
        if fd != self.fd or fd is None:
            return False
        found = {}
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

    def _event(self, wd, mask, name, found):
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


class Ops:
    """All three, behind the one entry the supervisor's loop calls."""

    def __init__(self, emit):
        self.emit = emit
        self.files = Files(emit)
        self.processes = Processes(emit)
        self.watchers = Watchers(emit)

    def handle(self, request):
        ident = request.get("id")
        try:
            op = request.get("op")
            if op == "fs":
                answer = self.files.handle(request)
            elif isinstance(op, str) and op.startswith("proc."):
                answer = self.processes.handle(request)
            elif op in ("watch.start", "watch.stop"):
                answer = self.watchers.handle(request)
            else:
                raise OpError("invalid", "unknown op %r" % (op,))
            size = len(json.dumps(answer))
            if size > REPLY_CAP:
                raise OpError("too_large", "the answer is %d bytes, more than the %d one reply carries; ask for less "
                              "(a smaller depth, a subdirectory)" % (size, REPLY_CAP))  # fmt: skip
            self.emit({"ev": "reply", "id": ident, "ok": answer})
        except OpError as exc:
            self.emit({"ev": "reply", "id": ident, "error": {"kind": exc.kind, "message": exc.message}})
        except Exception as exc:  # an op never takes the supervisor down
            self.emit({"ev": "reply", "id": ident, "error": {"kind": "failed", "message": "%s: %s" % (type(exc).__name__, exc)}})
