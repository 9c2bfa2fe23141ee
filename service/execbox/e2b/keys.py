"""The E2B room's Redis keys: what a sandbox adds to its session (template, access token digest,
code contexts, watchers)."""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.sessions.keys import SessionKeys

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "e2b:{id}",
        "string (JSON SandboxEntry)",
        "sessions.max_lifetime_s + retention_s",
        ("api",),
        (),
        "an E2B sandbox's template, tenant and access-token digest, by its session id",
    ),
    KeySpec(
        "e2b:{id}:contexts",
        "hash: context id -> JSON {language, cwd}",
        "sessions.max_lifetime_s + retention_s",
        ("api",),
        (),
        "the code contexts an E2B sandbox made beside its defaults (execbox.e2b.contexts)",
    ),
    KeySpec(
        "e2b:{id}:watchers",
        "set of watcher ids",
        "sessions.max_lifetime_s + retention_s",
        ("api",),
        (),
        "the directory watchers an E2B sandbox made with CreateWatcher (execbox.e2b.watchers)",
    ),
)


class E2bKeys(SessionKeys):
    def sandbox(self, session_id: str) -> str:
        return self._k("e2b", session_id)

    def sandbox_contexts(self, session_id: str) -> str:
        return self._k("e2b", session_id, "contexts")

    def sandbox_watchers(self, session_id: str) -> str:
        return self._k("e2b", session_id, "watchers")


__all__ = ["SCHEMA", "E2bKeys"]
