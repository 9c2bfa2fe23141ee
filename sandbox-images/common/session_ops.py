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

The ops themselves: files (session_files.py, within the paths of session_paths.py), processes
(session_processes.py) and directory watchers (session_watchers.py).
"""

from __future__ import annotations

import json

from session_files import Files
from session_paths import Emit, Json, OpError
from session_processes import Processes
from session_watchers import Watchers

REPLY_CAP = 768 * 1024
"""The longest reply line (the worker reads lines of 1 MiB at most and loses a session that sends a
longer one): a larger answer is refused as too_large, saying how to ask for less."""


class Ops:
    """All three, behind the one entry the supervisor's loop calls."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.files = Files(emit)
        self.processes = Processes(emit)
        self.watchers = Watchers(emit)

    def handle(self, request: Json) -> None:
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
                raise OpError("invalid", f"unknown op {op!r}")
            size = len(json.dumps(answer))
            if size > REPLY_CAP:
                raise OpError("too_large", f"the answer is {size} bytes, more than the {REPLY_CAP} one reply carries; "
                              "ask for less (a smaller depth, a subdirectory)")  # fmt: skip
            self.emit({"ev": "reply", "id": ident, "ok": answer})
        except OpError as exc:
            self.emit({"ev": "reply", "id": ident, "error": {"kind": exc.kind, "message": exc.message}})
        except Exception as exc:  # an op never takes the supervisor down
            self.emit(
                {"ev": "reply", "id": ident, "error": {"kind": "failed", "message": f"{type(exc).__name__}: {exc}"}}
            )
