"""What Redis keeps of a session."""

from __future__ import annotations

from pydantic import Field

from execbox.files.schemas import InputFileRef
from execbox.sessions.schemas import SessionPublic


class SessionRecord(SessionPublic):
    tenant: str = Field(description="Tenant that owns it.")
    env: dict[str, str] = Field(default_factory=dict, description="The interpreter's environment.")
    files: list[InputFileRef] = Field(default_factory=list, description="Files placed before the start.")
    worker: str | None = Field(None, description="The worker holding it.")
    trace_id: str = Field(description="Trace id of the request that created it.")

    def public(self) -> SessionPublic:
        return SessionPublic.model_validate(self.model_dump(include=set(SessionPublic.model_fields)))

    def deadline(self) -> float:
        """When it ends by itself: idle timeout or max lifetime, whichever is sooner."""
        return min(self.last_activity_at + self.idle_timeout_s, self.created_at + self.max_lifetime_s)
