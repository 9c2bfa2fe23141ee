"""The script library's errors. Codes are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import NotFound


class ScriptNotFound(NotFound):
    code = "script.not_found"
    noun = "script"
    hint = "; GET /v1/scripts lists this tenant's scripts"


__all__ = ["ScriptNotFound"]
