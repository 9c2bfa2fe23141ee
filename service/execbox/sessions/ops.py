"""Files and processes in a held session, beside its cells: the API asks, the holder relays.

A request is a JSON object with an op id the asker chose (`new_op`), pushed on the session's
`ses:{id}:asks`. The worker holding the session relays it to the sandbox's supervisor, which serves
it between its other work (sandbox-images/common/session_ops.py documents each request and answer),
and pushes everything said about that id on `ses:{id}:answers:{op}`: a read's chunks, then the reply;
for a process it started, also the process's output and its end. Another asker may follow a
running process (`proc.watch`, with the pid) and stop following it (`proc.unwatch`, with the op id
it watched under). An asker that stops reading is not waited for: its answers expire
(ANSWER_TTL_S), and one that lets ANSWER_CAP of them pile up is dropped (a last "dropped" answer).
When the session ends, every open request and every watcher gets a last "gone".

The holder trusts nothing it relays to have come from a well-behaved API: a request that is not
one of OPS with a well-formed id is set aside (logged, counted) and the relay goes on.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable
from secrets import token_hex
from typing import Any

import redis.asyncio as aioredis

from execbox.core.errors import ServiceError
from execbox.sandbox.runtime import SessionSandbox
from execbox.sessions.keys import SessionKeys
from execbox.sessions.store import SessionStore

log = logging.getLogger(__name__)
ANSWER_TTL_S = 60
ANSWER_CAP = 4096
OPS = frozenset(
    {"fs", "proc.start", "proc.input", "proc.close", "proc.signal", "proc.list", "proc.watch", "proc.unwatch"}
)
_OP_ID = re.compile(r"[0-9a-f]{24}")


def new_op() -> str:
    return token_hex(12)


class Relay:
    """The holder's side: requests down to the sandbox, its answers back to their askers."""

    def __init__(
        self, store: SessionStore, session_id: str, sandbox: SessionSandbox, set_aside: Callable[[], object]
    ) -> None:
        """`set_aside` counts a request that was not relayed (unreadable)."""
        self.store, self.session_id, self.sandbox = store, session_id, sandbox
        self._set_aside = set_aside
        self._lock = threading.Lock()
        self._open: set[str] = set()
        """Requests sent to the sandbox and not answered yet."""
        self._starts: set[str] = set()
        self._watchers: dict[int, set[str]] = {}
        """A running process's pid -> the op ids its output and end go to."""
        sandbox.listen(self.heard)

    def run(self, stop: threading.Event) -> None:
        """Relay until stop is set (the session is over), then tell every waiting asker."""
        try:
            while not stop.is_set():
                try:
                    raw = self.store.next_op(self.session_id, 1.0)
                    if raw is not None:
                        self._relay(raw)
                except ServiceError as exc:
                    log.warning("session %s ops: %s", self.session_id, exc.message)
                    stop.wait(1.0)
                except Exception:  # the relay never dies on one request: it goes on with the next
                    log.exception("session %s: relaying a request failed", self.session_id)
                    stop.wait(1.0)
        finally:
            with self._lock:
                waiting = self._open | {op for ops in self._watchers.values() for op in ops}
                self._open, self._watchers = set(), {}
            for op in waiting:
                self._push(op, {"ev": "gone"})

    def _relay(self, raw: str) -> None:
        try:
            request = json.loads(raw)
            op, kind = request["id"], request["op"]
            if not isinstance(op, str) or not _OP_ID.fullmatch(op) or kind not in OPS:
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
            self._open.add(op)
            if kind == "proc.start":
                self._starts.add(op)
        self.sandbox.op(request)

    def heard(self, event: dict[str, Any]) -> None:
        """The sandbox's word outside a cell (called from the thread that reads it)."""
        kind = event.get("ev")
        if kind in ("reply", "chunk"):
            op = event.get("id")
            with self._lock:
                if not isinstance(op, str) or op not in self._open:
                    return  # not a request of ours (the sandbox's word is not trusted to be)
                if kind == "reply":
                    self._open.discard(op)
                    pid = (event.get("ok") or {}).get("pid") if isinstance(event.get("ok"), dict) else None
                    if op in self._starts and isinstance(pid, int):
                        self._watchers[pid] = {op}
                    self._starts.discard(op)
            self._push(str(op), event)
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


async def answers(
    client: aioredis.Redis, keys: SessionKeys, session_id: str, op: str, wait_s: float
) -> AsyncIterator[dict[str, Any]]:
    """The answers to one request as they come; {"ev": "quiet"} after each wait_s without one
    (the caller checks that the session still runs, sends a keepalive, or gives up)."""
    key = keys.session_answers(session_id, op)
    while True:
        got = await client.blpop([key], timeout=wait_s)
        if got is None:
            yield {"ev": "quiet"}
            continue
        try:
            answer = json.loads(got[1])
        except ValueError:
            continue
        if isinstance(answer, dict):
            yield answer
