"""What a client sends to open a session and what it sees of one."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from execbox.catalog.schemas import AppliedPolicy, PolicyRequest
from execbox.executions.schemas import ExecutionError, InputFile, Labels, check_env
from execbox.sessions.status import SessionEnd, SessionStatus


class SessionCreate(BaseModel):
    """POST /v1/sessions."""

    model_config = ConfigDict(extra="forbid")

    language: str = Field(min_length=1, max_length=64, description="A language with sessions (GET /v1/languages).")
    policy: PolicyRequest = Field(
        default_factory=PolicyRequest,
        description="The session's limits (memory, CPU, pids, disk apply to the whole session; `timeout_s` is "
        "each execution's default). Network must be `none`.",
    )
    files: list[InputFile] = Field(default_factory=list, description="Files placed in /workspace before the start.")
    env: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Environment of the session's interpreter (as an execution's)."
    )
    idle_timeout_s: int = Field(600, ge=1, description="End the session after this long without an execution.")
    max_lifetime_s: int = Field(3600, ge=1, description="End the session this long after it was created.")
    labels: Labels = Field(default_factory=dict, max_length=16, description="Free-form labels, returned as given.")

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env(value)


class SessionPublic(BaseModel):
    id: str = Field(description="Session id, `ses_` followed by 26 characters.")
    status: SessionStatus = Field(description="starting → ready → ended.")
    language: str = Field(description="Canonical language name.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels from the request.")
    created_at: float = Field(description="Unix time the session was created.")
    ready_at: float | None = Field(None, description="Unix time its sandbox and kernel were ready.")
    ended_at: float | None = Field(None, description="Unix time it ended.")
    expires_at: float = Field(description="When it ends unless used again (idle timeout or max lifetime, sooner).")
    idle_timeout_s: int = Field(description="Idle timeout, seconds.")
    max_lifetime_s: int = Field(description="Maximum lifetime, seconds.")
    last_activity_at: float = Field(
        description="Unix time of its last execution's end (or when it became ready; its creation before)."
    )
    executions: int = Field(0, description="Executions run in it so far.")
    running: str | None = Field(None, description="The execution running in it now, if any.")
    kernel_restarts: int = Field(0, description="Times its kernel was restarted (a cell that would not stop).")
    end_reason: SessionEnd | None = Field(None, description="Why it ended.")
    error: ExecutionError | None = Field(None, description="Set when it ended because something failed.")
    policy: AppliedPolicy = Field(description="The limits its sandbox runs with.")


class SessionList(BaseModel):
    sessions: list[SessionPublic] = Field(description="Newest first.")
