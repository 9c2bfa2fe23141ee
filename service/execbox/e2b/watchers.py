"""envd's directory watchers over the sandbox's (session_ops.py's `Watchers`, inotify).

Two forms, as the SDKs use them. WatchDir (the async SDKs) is a server stream: the start event,
then each change as it is reported, keepalives while none comes; the watcher stops when the
client leaves. CreateWatcher, GetWatcherEvents and RemoveWatcher (the sync Python SDK) keep a
watcher between calls: its id is the op id of the request that made it, its events wait on that
op's answers (sessions.ops: they expire when no one reads them for a minute, and a watcher whose
reader lets thousands pile up is dropped), and the ids a sandbox made are listed
(`e2b:{id}:watchers`) so that another sandbox's id, or a made-up one, is not found.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import redis
from anyio import CancelScope, to_thread

from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.core.redis import redis_errors
from execbox.e2b.connect import connect_code, end_stream, envelope
from execbox.e2b.envd import Envd, sandbox_path
from execbox.e2b.errors import PathNotFound
from execbox.e2b.keys import E2bKeys
from execbox.e2b.sandboxes import Opened, sandbox_id
from execbox.sessions.ops import OP_ID

TYPES = {"create": "EVENT_TYPE_CREATE", "write": "EVENT_TYPE_WRITE", "remove": "EVENT_TYPE_REMOVE",
         "rename": "EVENT_TYPE_RENAME", "chmod": "EVENT_TYPE_CHMOD"}  # fmt: skip
KEEPALIVE_QUIETS = 30
"""Quiet seconds before a keepalive event."""
UNARY = frozenset({"CreateWatcher", "GetWatcherEvents", "RemoveWatcher"})
DRAIN_MAX = 10_000
"""Events one GetWatcherEvents returns at most (the rest wait for the next)."""


class WatcherBook:
    """The watchers a sandbox made with CreateWatcher (a set per sandbox)."""

    def __init__(self, client: redis.Redis, keys: E2bKeys, ttl_s: int) -> None:
        self.redis, self.keys, self.ttl_s = client, keys, ttl_s

    def add(self, session_id: str, watcher: str) -> None:
        key = self.keys.sandbox_watchers(session_id)
        with redis_errors():
            pipe = self.redis.pipeline()
            pipe.sadd(key, watcher)
            pipe.expire(key, self.ttl_s)
            pipe.execute()

    def has(self, session_id: str, watcher: str) -> bool:
        with redis_errors():
            return bool(self.redis.sismember(self.keys.sandbox_watchers(session_id), watcher))

    def forget(self, session_id: str, watcher: str) -> None:
        with redis_errors():
            pipe = self.redis.pipeline()
            pipe.srem(self.keys.sandbox_watchers(session_id), watcher)
            pipe.delete(self.keys.session_answers(session_id, watcher))
            pipe.execute()

    def drain(self, session_id: str, watcher: str) -> list[str]:
        """What waits on the watcher's answers now (taken off)."""
        with redis_errors():
            taken = self.redis.lpop(self.keys.session_answers(session_id, watcher), DRAIN_MAX)
        return [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in taken or []]


def _start_request(body: dict[str, Any]) -> dict[str, Any]:
    path = body.get("path")
    if not isinstance(path, str):
        raise InvalidRequest("path is required", (FieldProblem("path", "the directory to watch"),))
    return {"op": "watch.start", "path": sandbox_path(path), "recursive": body.get("recursive") is True}


def _events(answer: dict[str, Any]) -> list[dict[str, str]]:
    """A report's events in E2B's FilesystemEvent shape (anything unreadable is left out)."""
    found = answer.get("events")
    events = found if isinstance(found, list) else []
    return [{"name": str(e.get("name", "")), "type": TYPES[str(e.get("type"))]}
            for e in events if isinstance(e, dict) and str(e.get("type")) in TYPES]  # fmt: skip


def _watcher(body: dict[str, Any]) -> str:
    watcher = body.get("watcherId")
    if not isinstance(watcher, str) or not OP_ID.fullmatch(watcher):
        raise InvalidRequest("bad watcher id", (FieldProblem("watcherId", "the id CreateWatcher gave"),))
    return watcher


async def rpc(envd: Envd, book: WatcherBook, opened: Opened, method: str, body: dict[str, Any]) -> dict[str, Any]:
    """CreateWatcher, GetWatcherEvents, RemoveWatcher."""
    session = opened.session.id
    if method == "CreateWatcher":
        op = await envd.send(opened, _start_request(body))
        await envd.answered(opened, op)  # the watcher's id is this request's: kept, not just asked
        await to_thread.run_sync(book.add, session, op)
        return {"watcherId": op}
    watcher = _watcher(body)
    if not await to_thread.run_sync(book.has, session, watcher):
        raise PathNotFound(f"no watcher {watcher}: it was removed, or ended with its sandbox")
    if method == "GetWatcherEvents":
        events: list[dict[str, str]] = []
        for raw in await to_thread.run_sync(book.drain, session, watcher):
            try:
                answer = json.loads(raw)
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("ev") in ("gone", "dropped"):
                await to_thread.run_sync(book.forget, session, watcher)  # the next call: not found
            elif isinstance(answer, dict) and answer.get("ev") == "wev":
                events.extend(_events(answer))
        return {"events": events}
    # RemoveWatcher
    await envd.ask(opened, {"op": "watch.stop", "watch": watcher})
    await to_thread.run_sync(book.forget, session, watcher)
    return {}


async def stream(envd: Envd, opened: Opened, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """WatchDir as Connect envelopes: start, changes, keepalives; errors in the end-of-stream."""
    op = None
    started = False
    try:
        op = await envd.send(opened, _start_request(body))
        quiet = 0
        async for answer in envd.follow(opened, op):
            kind = answer.get("ev")
            if kind == "reply":
                envd.reply(answer)
                started = True
                yield envelope({"start": {}})
            elif kind == "wev":
                quiet = 0
                for event in _events(answer):
                    yield envelope({"filesystem": event})
            elif kind == "quiet":
                quiet += 1
                if quiet >= KEEPALIVE_QUIETS:
                    quiet = 0
                    yield envelope({"keepalive": {}})
        yield end_stream("unavailable", f"The sandbox {sandbox_id(opened.session.id)} was not found: it ended")
    except ServiceError as exc:
        started = False  # refused: nothing to stop
        yield end_stream(connect_code(exc.http_status), exc.message)
    finally:
        if op is not None and started:
            with CancelScope(shield=True):
                try:
                    await envd.send(opened, {"op": "watch.stop", "watch": op})
                except ServiceError:
                    pass  # Redis away: the watcher ends with the sandbox


__all__ = ["TYPES", "UNARY", "WatcherBook", "rpc", "stream"]
