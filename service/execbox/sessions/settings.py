"""The session room's settings section (`EXECBOX_SESSIONS__*`), and `SessionsConfig`: what the room reads of
the deployment's settings (the executions room's part, since a session's runs are executions, and its own)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from execbox.executions.settings import ExecutionsConfig


class SessionSettings(BaseModel):
    per_worker: int = Field(4, ge=0, description="Sessions one worker process holds at once (0: it holds none).")
    max_idle_timeout_s: int = Field(
        3600, ge=1, description="The longest idle_timeout_s a session may ask for (422 above)."
    )
    max_lifetime_s: int = Field(
        86400, ge=1, description="The longest max_lifetime_s a session may ask for (422 above)."
    )
    start_timeout_s: float = Field(
        120.0, gt=0, description="A session no worker has started this long after creation ends as sandbox_error."
    )


class SessionsConfig(ExecutionsConfig, Protocol):
    """What the sessions room reads of the deployment's settings."""

    @property
    def sessions(self) -> SessionSettings: ...


__all__ = ["SessionSettings", "SessionsConfig"]
