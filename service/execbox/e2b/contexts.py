"""The code interpreter's contexts as the session's contexts (ExecutionCreate.session_context).

Each language the sandbox's session offers (GET /v1/languages' `session_contexts`) has a default
context whose id is the language's name (`python`, `javascript`, `bash`); run_code with a language
and no context runs there. POST /contexts makes another, `<language>-<10 hex>`, which the kernel
starts afresh on its first cell; it is kept (`e2b:{id}:contexts`, with its working directory)
until it is removed, at most MAX_CONTEXTS per sandbox. A context's id maps to a native context
name by its first hyphen (`python-3f…` is `python:3f…`); the default of the session's own language
is the native default (no name), so a plain run_code reads as a plain cell in the run records.

Restarting a context runs the kernel's `%reset -f` in it (IPython's own for Python; the kernel
does the same for the others: a new node process, a shell with no saved state), then returns to
its working directory. Removing one resets it, so it holds no memory, then forgets it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from secrets import token_hex
from typing import Any

import redis

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.redis import redis_errors
from execbox.e2b.envd import HOME, e2b_path, sandbox_path
from execbox.e2b.errors import ContextNotFound, TooManyContexts
from execbox.e2b.keys import E2bKeys
from execbox.e2b.schemas import Context

MAX_CONTEXTS = 8
"""Contexts a sandbox may make beside its defaults (each may hold an interpreter's memory)."""
ALIASES = {"js": "javascript", "py": "python", "python3": "python", "sh": "bash"}
"""The SDK's and users' other names for a language (the code interpreter's own: js)."""
RESET = "%reset -f"
"""The cell that empties a context (kernel.py)."""
_ID = re.compile(r"(?P<language>python|javascript|bash)(?:-(?P<name>[0-9a-f]{10}))?")


@dataclass(frozen=True)
class Target:
    """Where a cell runs: the E2B context and the native context name (None: the session's own)."""

    context: Context
    native: str | None


def language_of(asked: str | None, offered: tuple[str, ...], field: str) -> str:
    """The language a request names (the default: the first offered), or a 400 naming `field`."""
    if asked is None or not asked.strip():
        return offered[0]
    name = asked.strip().lower()
    name = ALIASES.get(name, name)
    if name not in offered:
        shown = ", ".join(offered)
        raise InvalidRequest(
            "this sandbox has no such language",
            (FieldProblem(field, f"{asked[:32]!r} is not offered here; offered: {shown}"),),
        )
    return name


def cwd_of(asked: str | None) -> str:
    """A context's directory as E2B spells it (relative: under HOME, as the sandbox's files)."""
    return HOME if not asked else e2b_path(sandbox_path(asked, "cwd"))


def chdir_code(language: str, cwd: str) -> str:
    """A cell that moves a context to cwd, failing when it is not a directory."""
    if language == "python":
        return f"__import__('os').chdir({cwd!r})"
    if language == "javascript":
        return f"process.chdir({json.dumps(cwd)})"
    return "cd '" + cwd.replace("'", "'\\''") + "'"


class ContextBook:
    """The contexts a sandbox made (a hash per sandbox, id -> JSON {language, cwd})."""

    def __init__(self, client: redis.Redis, keys: E2bKeys, ttl_s: int) -> None:
        self.redis, self.keys, self.ttl_s = client, keys, ttl_s

    def all(self, session_id: str, offered: tuple[str, ...]) -> list[Context]:
        with redis_errors():
            raw = self.redis.hgetall(self.keys.sandbox_contexts(session_id))
        made = [c for c in self._read(raw) if c.language in offered]
        return [*(Context(id=lang, language=lang, cwd=HOME) for lang in offered), *sorted(made, key=lambda c: c.id)]

    def find(self, session_id: str, context_id: str, offered: tuple[str, ...]) -> Target:
        found = _ID.fullmatch(context_id)
        if found is None or found["language"] not in offered:
            raise ContextNotFound(context_id[:64])
        language, name = found["language"], found["name"]
        if name is None:
            return Target(
                Context(id=language, language=language, cwd=HOME), None if language == offered[0] else language
            )
        with redis_errors():
            raw = self.redis.hget(self.keys.sandbox_contexts(session_id), context_id)
        made = list(self._read({context_id: raw} if raw is not None else {}))
        if not made:
            raise ContextNotFound(context_id[:64])
        return Target(made[0], f"{language}:{name}")

    def add(self, session_id: str, language: str, cwd: str) -> Target:
        """A new context, or TooManyContexts (the cap holds under concurrent creates: the one over it
        is taken back)."""
        name = token_hex(5)
        context = Context(id=f"{language}-{name}", language=language, cwd=cwd)
        key = self.keys.sandbox_contexts(session_id)
        with redis_errors():
            pipe = self.redis.pipeline()
            pipe.hset(key, context.id, json.dumps({"language": language, "cwd": cwd}))
            pipe.expire(key, self.ttl_s)
            pipe.hlen(key)
            count = pipe.execute()[-1]
            if count > MAX_CONTEXTS:
                self.redis.hdel(key, context.id)
                raise TooManyContexts(MAX_CONTEXTS)
        return Target(context, f"{language}:{name}")

    def forget(self, session_id: str, context_id: str) -> None:
        with redis_errors():
            self.redis.hdel(self.keys.sandbox_contexts(session_id), context_id)

    @staticmethod
    def _read(raw: Mapping[Any, Any]) -> Iterator[Context]:
        """The stored contexts that read as such (anything else is skipped, never an error)."""
        for key, value in raw.items():
            try:
                context_id = key.decode() if isinstance(key, bytes) else str(key)
                fields = json.loads(value)
                found = _ID.fullmatch(context_id)
                if found is None or found["name"] is None or fields["language"] != found["language"]:
                    continue
                yield Context(id=context_id, language=fields["language"], cwd=cwd_of(fields["cwd"]))
            except (ValueError, KeyError, TypeError, InvalidRequest):
                continue


__all__ = ["HOME", "MAX_CONTEXTS", "RESET", "ContextBook", "Target", "chdir_code", "cwd_of", "language_of"]
