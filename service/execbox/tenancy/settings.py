"""The tenancy room's settings section: API keys and the admin token (`EXECBOX_AUTH__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class AuthSettings(BaseModel):
    enabled: bool = Field(
        True,
        description="Require an API key on every /v1 request. Turn off only for local "
        "development: every request is then tenant `default`.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for /v1/admin (key management). Unset: "
        "the admin endpoints answer 404; use `execbox keys`.",
    )


__all__ = ["AuthSettings"]
