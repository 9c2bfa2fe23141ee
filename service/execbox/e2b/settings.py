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
    max_file_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024,
        description="The largest file one read or write of the sandbox's filesystem moves (larger: 413).",
    )  # fmt: skip
    call_timeout_s: float = Field(
        60.0, gt=0, le=600, description="How long a file or process call waits for the sandbox's answer (then 504)."
    )


__all__ = ["E2bSettings", "Template"]
