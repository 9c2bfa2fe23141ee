"""The webhook room's settings section (`EXECBOX_WEBHOOKS__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WebhookSettings(BaseModel):
    allow_hosts: list[str] = Field(
        default_factory=list,
        description='Host patterns (fnmatch) callbacks may target, e.g. ["hooks.example.com", "*.corp"]. '
        "Empty: webhooks are refused (422), so a callback can never reach an internal service by default.",
    )
    max_attempts: int = Field(5, ge=1, le=20, description="Tries per delivery before giving up.")
    backoff_s: float = Field(1.0, gt=0, description="First retry delay; doubles each try, plus up to 50% jitter.")
    timeout_s: float = Field(10.0, gt=0, description="Timeout of each delivery request.")
    claim_idle_s: float = Field(
        30.0,
        gt=0,
        description="A delivery a consumer took and never acknowledged (it died) is taken over by another "
        "worker after this long.",
    )


__all__ = ["WebhookSettings"]
