"""The sessions room's errors: a session that is not there, or already ended. Codes are listed in docs/api.md,
the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import ConflictError, NotFound


class SessionNotFound(NotFound):
    code = "session.not_found"
    noun = "session"
    hint = "; GET /v1/sessions lists this tenant's sessions"


class SessionEnded(ConflictError):
    code = "session.ended"


__all__ = ["SessionEnded", "SessionNotFound"]
