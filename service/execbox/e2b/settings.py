"""The E2B room's settings section (`EXECBOX_E2B__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Template(BaseModel):
    """What an E2B template name stands for here: a session language and a named policy."""

    language: str = Field("python", description="The session's language (one with a session kernel).")
    policy: str = Field("default", description="The named policy its sandbox runs with.")


class E2bSettings(BaseModel):
    enabled: bool = Field(True, description="Serve the E2B-compatible API under /e2b (docs/e2b.md).")
    templates: dict[str, Template] = Field(
        default_factory=lambda: {"code-interpreter-v1": Template(), "base": Template()},
        description="E2B template names a client may ask for, each a language and a policy "
        "(`code-interpreter-v1` is the code-interpreter SDK's default, `base` the plain SDK's).",
    )
    default_timeout_s: int = Field(300, ge=1, description="A sandbox's lifetime when create names no timeout.")


__all__ = ["E2bSettings", "Template"]
