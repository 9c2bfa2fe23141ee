"""A sandbox's files and processes (what E2B calls envd), as requests to its session's holder.

Each call becomes one request on the session's ops list (execbox.sessions.ops); the answers come
back on a list of its own, read here without blocking the event loop. Paths are E2B's: relative
ones resolve under the sandbox user's home, /home/user, which here is the workspace itself (the
image links one to the other), so what a file call writes a cell reads and the other way round.
The sandbox enforces the path rules (sandbox-images/common/session_paths.py); this side only
translates names and waits.
"""

from __future__ import annotations

import base64
import json
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from anyio import to_thread

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.redis import redis_errors
from execbox.e2b.errors import (
    EnvdFailed,
    EnvdTimeout,
    FileExists,
    FileTooLarge,
    PathNotFound,
    PathRefused,
    SandboxGone,
)
from execbox.e2b.sandboxes import Opened, sandbox_id
from execbox.sessions.keys import SessionKeys
from execbox.sessions.ops import answers, new_op
from execbox.sessions.status import SessionStatus
from execbox.sessions.store import SessionStore

HOME = "/home/user"
WORKDIR = "/workspace"
QUIET_S = 1.0
"""How long one wait for an answer lasts before the session is checked (and a stream kept alive)."""


def sandbox_path(path: str | None, field: str = "path") -> str:
    """An E2B path as the sandbox takes it: absolute, /home/user spelled /workspace."""
    if not path or "\x00" in path or len(path) > 4096:
        raise InvalidRequest("bad path", (FieldProblem(field, "a path of 1 to 4096 characters, without NUL"),))
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    full = "/" + posixpath.normpath(posixpath.join(HOME, path)).lstrip("/")  # normpath keeps a leading //
    if full == HOME or full.startswith(HOME + "/"):
        full = WORKDIR + full[len(HOME) :]
    return full


def e2b_path(path: str) -> str:
    """The other way: what the sandbox calls /workspace the client calls /home/user."""
    if path == WORKDIR or path.startswith(WORKDIR + "/"):
        return HOME + path[len(WORKDIR) :]
    return path


@dataclass(frozen=True)
class Envd:
    store: SessionStore
    streams: aioredis.Redis
    keys: SessionKeys
    max_file_bytes: int
    call_timeout_s: float = 60.0

    async def ask(self, opened: Opened, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its reply: (what it answered, the bytes a read sent)."""
        return await self.answered(opened, await self.send(opened, request))

    async def answered(self, opened: Opened, op: str) -> tuple[dict[str, Any], bytes]:
        """The reply to a request already sent (op), with the bytes a read sent before it; raises
        the sandbox's error, EnvdTimeout, or SandboxGone."""
        data = bytearray()
        deadline = time.monotonic() + self.call_timeout_s
        async for answer in self.follow(opened, op):
            kind = answer.get("ev")
            if kind == "chunk":
                data += base64.b64decode(str(answer.get("b", "")))
            elif kind == "reply":
                return self.reply(answer), bytes(data)
            elif kind == "quiet" and time.monotonic() > deadline:
                raise EnvdTimeout(f"the sandbox did not answer within {self.call_timeout_s:.0f} s")
        raise SandboxGone(sandbox_id(opened.session.id))

    async def send(self, opened: Opened, request: dict[str, Any]) -> str:
        op = new_op()
        raw = json.dumps({**request, "id": op})
        await to_thread.run_sync(self.store.ask, opened.session.id, raw)
        return op

    async def follow(self, opened: Opened, op: str) -> AsyncIterator[dict[str, Any]]:
        """A request's answers until the sandbox is gone (then it ends); "quiet" ones in between
        while nothing comes, after the session was found still running."""
        with redis_errors():
            async for answer in answers(self.streams, self.keys, opened.session.id, op, QUIET_S):
                kind = answer.get("ev")
                if kind in ("gone", "dropped"):
                    return
                if kind == "quiet" and not await to_thread.run_sync(self._running, opened):
                    return
                yield answer

    def _running(self, opened: Opened) -> bool:
        record = self.store.get(opened.session.id)
        return record is not None and record.status is not SessionStatus.ENDED

    async def unwatch(self, opened: Opened, op: str) -> None:
        await self.send(opened, {"op": "proc.unwatch", "of": op})

    @staticmethod
    def reply(answer: dict[str, Any]) -> dict[str, Any]:
        """A reply's answer, or its error raised as the room's."""
        error = answer.get("error")
        if isinstance(error, dict):
            kind, message = error.get("kind"), str(error.get("message", ""))[:2000]
            kinds = {"not_found": PathNotFound, "exists": FileExists, "too_large": FileTooLarge, "invalid": PathRefused}
            raise kinds.get(str(kind), EnvdFailed)(message)
        ok = answer.get("ok")
        return ok if isinstance(ok, dict) else {}


__all__ = ["HOME", "Envd", "e2b_path", "sandbox_path"]
