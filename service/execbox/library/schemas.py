"""A script library on the wire: immutable versions of named code with input and output schemas."""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from execbox.catalog.schemas import PolicyRequest
from execbox.executions.schemas import InputFile, Labels

NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,99}$"
VERSION_PATTERN = r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$"
"""Semantic versioning 2.0.0 (build metadata is not accepted: it would not order)."""
_STRICT = ConfigDict(extra="forbid")


def _valid_schema(value: dict[str, Any]) -> dict[str, Any]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as exc:
        raise ValueError(f"not a valid JSON Schema: {exc.message}") from exc
    return value


class ScriptCreate(BaseModel):
    model_config = _STRICT

    name: str = Field(pattern=NAME_PATTERN, description="Lower-case name, dots allowed: `reports.weekly_errors`.")
    version: str = Field(pattern=VERSION_PATTERN, description="Semantic version, e.g. `1.2.0`. Versions are immutable.")
    language: str = Field("python", min_length=1, max_length=64, description="Language name or alias.")
    code: str = Field(min_length=1, description="The script's source.")
    description: str = Field("", max_length=4000, description="What it does (searched by GET /v1/scripts?q=).")
    tags: list[str] = Field(default_factory=list, max_length=32, description="Tags (GET /v1/scripts?tag=).")
    input_schema: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of its inputs.")
    output_schema: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of its declared outputs.")
    default_policy: PolicyRequest = Field(default_factory=PolicyRequest, description="Limits it runs with.")
    input_files: list[str] = Field(
        default_factory=list, max_length=64, description="Paths of the input files it expects (informational)."
    )

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schemas(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _valid_schema(value)


class VersionStatus(enum.StrEnum):
    DRAFT = "draft"
    PROVEN = "proven"
    DEPRECATED = "deprecated"


class ScriptVersion(ScriptCreate):
    """A stored version: the registration plus its status, evidence and use."""

    model_config = ConfigDict(extra="ignore")

    status: VersionStatus = Field(VersionStatus.DRAFT, description="draft → proven → deprecated.")
    sha256: str = Field(description="SHA-256 of the registration's canonical JSON.")
    created_at: float = Field(description="Unix time.")
    evidence: list[str] = Field(default_factory=list, description="Succeeded executions of this version (proven).")
    tenant: str = Field(description="Owner.")


class ScriptSummary(BaseModel):
    name: str
    description: str
    tags: list[str]
    latest: str = Field(description="Newest version.")
    proven: str | None = Field(None, description="Newest proven version, if any.")
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    shared: bool = Field(False, description="The operator's, published to every tenant.")


class VersionView(BaseModel):
    version: str
    status: VersionStatus
    sha256: str
    created_at: float
    evidence: list[str]
    uses: int = Field(description="Executions started from this version.")


class ScriptDetail(BaseModel):
    name: str
    versions: list[VersionView] = Field(description="Oldest first.")


class Promote(BaseModel):
    model_config = _STRICT

    status: Literal["proven", "deprecated"] = Field(description="The status to move to.")
    evidence: list[str] = Field(
        default_factory=list, max_length=100, description="For proven: succeeded executions of this version."
    )


class Invoke(BaseModel):
    model_config = _STRICT

    version: str = Field("proven", description="An exact version, or `proven` (the newest proven one).")
    inputs: dict[str, Any] = Field(default_factory=dict, description="Checked against the input schema.")
    files: list[InputFile] = Field(default_factory=list, description="Input files, as for an execution.")
    labels: Labels = Field(default_factory=dict, max_length=8, description="Labels for the execution.")
