"""The script library's errors. Codes are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import ConflictError, NotFound


class ScriptNotFound(NotFound):
    code = "script.not_found"
    noun = "script"
    hint = "; GET /v1/scripts lists this tenant's scripts"


class VersionConflict(ConflictError):
    """A version registered again with other content (versions are immutable)."""

    code = "run.conflict"
    """Clients met this refusal as `run.conflict` before the library had a class of its own; the
    code is part of the wire format, so it stays."""


__all__ = ["ScriptNotFound", "VersionConflict"]
