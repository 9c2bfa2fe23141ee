"""The holder's side of a session's file and process requests (execbox.sessions.ops says how they
are asked and answered): requests down to the sandbox, its answers back to their askers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from execbox.core.errors import ServiceError
from execbox.sandbox.runtime import SessionSandbox
from execbox.sessions.ops import ANSWER_CAP, ANSWER_TTL_S, OP_ID, OPS
from execbox.sessions.store import SessionStore

log = logging.getLogger(__name__)
ANSWER_DEADLINE_S = 90.0
"""The longest the supervisor may leave a request unanswered: it serves them between its other work,
which takes a minute at most (a kernel restart waits 60 s for the new kernel)."""


class Relay:
    """The holder's side: requests down to the sandbox, its answers back to their askers."""

    def __init__(
        self, store: SessionStore, session_id: str, sandbox: SessionSandbox, set_aside: Callable[[], object]
    ) -> None:
        """`set_aside` counts a request that was not relayed (unreadable)."""
        self.store, self.session_id, self.sandbox = store, session_id, sandbox
        self._set_aside = set_aside
        self._lock = threading.Lock()
        self._open: dict[str, float] = {}
        """Requests sent to the sandbox and not answered yet, with when they were sent (monotonic)."""
        self._starts: set[str] = set()
        self._watchers: dict[int, set[str]] = {}
        """A running process's pid -> the op ids its output and end go to."""
        self._dir_starts: set[str] = set()
        self._dirs: set[str] = set()
        """Directory watchers the sandbox confirmed (their op ids), whose events go to their askers."""
        sandbox.listen(self.heard)

    def run(self, stop: threading.Event) -> None:
        """Relay until stop is set (the session is over), then tell every waiting asker."""
        try:
            while not stop.is_set():
                try:
                    raw = self.store.next_op(self.session_id, 1.0)
                    if raw is not None:
                        self._relay(raw)
                    self._watch_answers()
                except ServiceError as exc:
                    log.warning("session %s ops: %s", self.session_id, exc.message)
                    stop.wait(1.0)
                except Exception:  # the relay never dies on one request: it goes on with the next
                    log.exception("session %s: relaying a request failed", self.session_id)
                    stop.wait(1.0)
        finally:
            with self._lock:
                waiting = set(self._open) | self._dirs | {op for ops in self._watchers.values() for op in ops}
                self._open, self._watchers, self._dirs = {}, {}, set()
            for op in waiting:
                self._push(op, {"ev": "gone"})

    def _relay(self, raw: str) -> None:
        try:
            request = json.loads(raw)
            op, kind = request["id"], request["op"]
            if not isinstance(op, str) or not OP_ID.fullmatch(op) or kind not in OPS:
                raise ValueError("not a request")
        except (ValueError, KeyError, TypeError):
            self._set_aside()
            log.warning("session %s: an unreadable file or process request was set aside", self.session_id)
            return
        if kind == "proc.watch":
            pid = request.get("pid")
            with self._lock:
                found = isinstance(pid, int) and pid in self._watchers  # (a pid of another type: not found)
                if found:
                    self._watchers[pid].add(op)
            error = None if found else {"kind": "not_found", "message": f"no running process {pid!r}"}
            self._push(op, {"ev": "reply", "id": op, **({"error": error} if error else {"ok": {"pid": pid}})})
            return
        if kind == "proc.unwatch":
            with self._lock:
                for ops in self._watchers.values():
                    ops.discard(str(request.get("of")))
            return
        with self._lock:
            self._open[op] = time.monotonic()
            if kind == "proc.start":
                self._starts.add(op)
            elif kind == "watch.start":
                self._dir_starts.add(op)
            if kind == "watch.stop":
                self._dirs.discard(str(request.get("watch")))
        self.sandbox.op(request)

    def _watch_answers(self) -> None:
        """A supervisor that has left a request unanswered for ANSWER_DEADLINE_S answers nothing
        (its own code stopped it, say): the sandbox is lost, and its holder ends the session."""
        with self._lock:
            oldest = min(self._open.values(), default=None)
        if oldest is not None and time.monotonic() - oldest > ANSWER_DEADLINE_S and self.sandbox.gone is None:
            self.sandbox.gone = (
                f"the session's supervisor left a file or process request unanswered for {ANSWER_DEADLINE_S:.0f} s "
                "(stopped, or its code kept it busy); the session was closed"
            )

    def heard(self, event: dict[str, Any]) -> None:
        """The sandbox's word outside a cell (called from the thread that reads it)."""
        kind = event.get("ev")
        if kind in ("reply", "chunk"):
            op = event.get("id")
            with self._lock:
                if not isinstance(op, str) or op not in self._open:
                    return  # not a request of ours (the sandbox's word is not trusted to be)
                if kind == "reply":
                    self._open.pop(op, None)
                    ok = event.get("ok")
                    pid = ok.get("pid") if isinstance(ok, dict) else None
                    if op in self._starts and isinstance(pid, int):
                        self._watchers[pid] = {op}
                    elif op in self._dir_starts and isinstance(ok, dict):
                        self._dirs.add(op)  # a watch.start that worked
                    self._starts.discard(op)
                    self._dir_starts.discard(op)
            self._push(str(op), event)
        elif kind == "wev":
            op = event.get("id")
            with self._lock:
                if not isinstance(op, str) or op not in self._dirs:
                    return
            if self._push(op, event) > ANSWER_CAP:
                with self._lock:
                    self._dirs.discard(op)
                self._push(op, {"ev": "dropped"})
        elif kind in ("pout", "pend"):
            pid = event.get("pid")
            if not isinstance(pid, int):
                return
            with self._lock:
                ops = set(self._watchers.get(pid, ()))
                if kind == "pend":
                    self._watchers.pop(pid, None)
            for op in ops:
                if self._push(op, event) > ANSWER_CAP:
                    with self._lock:
                        self._watchers.get(pid, set()).discard(op)
                    self._push(op, {"ev": "dropped"})

    def _push(self, op: str, event: dict[str, Any]) -> int:
        try:
            return self.store.answer(self.session_id, op, json.dumps(event), ANSWER_TTL_S)
        except ServiceError as exc:
            log.warning("session %s ops: %s", self.session_id, exc.message)
            return 0
