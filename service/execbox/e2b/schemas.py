"""E2B's wire shapes, as its SDK (e2b 2.63, e2b-code-interpreter 2.11) sends and reads them.

The field names are E2B's (camelCase on the control plane, snake_case on the code interpreter);
responses carry every key the SDK requires. Unknown request keys are kept so that the facade can
refuse a feature it does not offer by name instead of ignoring it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from execbox.core.errors import FieldProblem

ENVD_VERSION = "0.5.7"
"""The envd version the facade reports: at or above 0.4.0 the SDK sends no forced user, and at 0.5.7
it may upload file-like data as octet-stream (e2b/envd/versions.py)."""
UNSUPPORTED_CREATE = (
    "autoPause",
    "autoPauseMemory",
    "autoResume",
    "network",
    "mcp",
    "iam",
    "volumeMounts",
    "lifecycle",
)
"""Create fields of features this server does not offer: naming one is refused, never ignored."""


class NewSandbox(BaseModel):
    """POST /v2/sandboxes."""

    model_config = ConfigDict(extra="allow")

    templateID: str = Field(min_length=1, max_length=128)
    timeout: int | None = Field(None, ge=1)
    metadata: dict[str, str] = Field(default_factory=dict)
    envVars: dict[str, str] = Field(default_factory=dict)
    allow_internet_access: bool | None = None


class SetTimeout(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(ge=1)


class ConnectSandbox(BaseModel):
    model_config = ConfigDict(extra="allow")

    timeout: int | None = Field(None, ge=1)


class Sandbox(BaseModel):
    """What create and connect answer: the SDK needs the first four keys and sends the token back."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str = ENVD_VERSION
    envdAccessToken: str | None = None
    trafficAccessToken: str | None = None
    domain: str | None = None


class SandboxDetail(BaseModel):
    """GET /sandboxes/{id}, and each item of GET /v2/sandboxes."""

    templateID: str
    sandboxID: str
    clientID: str
    startedAt: str
    endAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: Literal["running", "paused"] = "running"
    envdVersion: str = ENVD_VERSION
    metadata: dict[str, str] = Field(default_factory=dict)


class Execute(BaseModel):
    """POST /execute: the SDK always sends the four keys, null when unset."""

    model_config = ConfigDict(extra="ignore")

    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class NewContext(BaseModel):
    model_config = ConfigDict(extra="ignore")

    language: str | None = None
    cwd: str | None = None


class Context(BaseModel):
    id: str
    language: str
    cwd: str


def problems(exc: ValidationError, names: dict[str, str]) -> tuple[FieldProblem, ...]:
    """A native model's validation errors in E2B's field names (`names`: native -> E2B)."""
    return tuple(
        FieldProblem(".".join([names.get(str(e["loc"][0]), str(e["loc"][0])), *map(str, e["loc"][1:])]), e["msg"])
        for e in exc.errors()
    )


def line(kind: str, **fields: Any) -> bytes:
    """One NDJSON line of /execute: every object has its `type`, and no line is ever blank."""
    return (json.dumps({"type": kind, **fields}, separators=(",", ":")) + "\n").encode()


__all__ = [
    "ENVD_VERSION",
    "UNSUPPORTED_CREATE",
    "ConnectSandbox",
    "Context",
    "Execute",
    "NewContext",
    "NewSandbox",
    "Sandbox",
    "SandboxDetail",
    "SetTimeout",
    "line",
    "problems",
]
