"""The E2B room's Redis key: what a sandbox adds to its session (template, access token digest)."""

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
)


class E2bKeys(SessionKeys):
    def sandbox(self, session_id: str) -> str:
        return self._k("e2b", session_id)


__all__ = ["SCHEMA", "E2bKeys"]
