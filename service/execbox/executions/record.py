"""What Redis keeps of an execution (ExecutionRecord) and the run record derived from it.

The stored record extends the public view, so every field a client sees is stored by construction;
`public()` projects it back, dropping what only the service may see (code, env, inputs, the webhook's
secret)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from pydantic import BaseModel, Field

from execbox.catalog.schemas import AppliedPolicy
from execbox.executions.schemas import (
    Artifact,
    ExecutionError,
    ExecutionPublic,
    Expect,
    Origin,
    OutputsSpec,
    Resources,
    StoredWebhook,
    Timing,
    Transition,
)
from execbox.executions.status import ExecutionStatus
from execbox.files.schemas import InputFileRef


class ExecutionRecord(ExecutionPublic):
    """What Redis stores: the public view plus what only the service needs."""

    tenant: str = Field("default", description="Tenant that owns it.")
    code: str = Field(description="Program source.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment.")
    files: list[InputFileRef] = Field(default_factory=list, description="Input files, stored as file objects.")
    stdin_b64: str = Field("", description="Standard input, base64.")
    inputs: Any = Field(None, description="JSON inputs.")
    outputs_spec: OutputsSpec = Field(default_factory=OutputsSpec, description="Which files come back.")
    expect: Expect | None = Field(None, description="Expectations.")
    webhook: StoredWebhook | None = Field(None, description="Callback and its secret.")
    request_sha256: str = Field(description="SHA-256 of the canonical request.")
    queue_deadline: float = Field(description="Unix time after which a queued execution expires.")
    queue: str | None = Field(None, description="The queue it was accepted on (None: stored before it was kept).")
    transitions: list[Transition] = Field(default_factory=list, description="Every status change.")
    cancel_requested: bool = Field(False, description="A client asked to cancel it.")
    context: dict[str, str] = Field(
        default_factory=dict,
        description="Set by a submitter acting for a run (run_id, step_id, attempt, idempotency_key); the "
        "program sees each as EXECBOX_<NAME>, e.g. EXECBOX_IDEMPOTENCY_KEY.",
    )

    kept_bytes: int = Field(
        0,
        description="Bytes of the record's worst case counted against the tenant's storage budget at admission "
        "(0: stored before budgets, or already settled to its size at the end).",
    )
    kept_bucket: int = Field(0, description="The budget's expiry bucket those bytes were counted in.")

    def public(self) -> ExecutionPublic:
        return ExecutionPublic.model_validate(self.model_dump(include=set(ExecutionPublic.model_fields)))


class RunRecord(BaseModel):
    """Everything needed to reproduce or diagnose one run."""

    id: str = Field(description="Execution id.")
    trace_id: str = Field(description="W3C trace id.")
    status: ExecutionStatus = Field(description="Lifecycle status.")
    language: str = Field(description="Language.")
    request_sha256: str = Field(description="SHA-256 of the canonical request JSON.")
    code_sha256: str = Field(description="SHA-256 of the code.")
    env_names: list[str] = Field(description="Names of the extra environment variables (values withheld).")
    input_files: list[InputFileRef] = Field(description="Input files with their sizes and hashes.")
    stdin_bytes: int = Field(description="Size of the stdin given.")
    policy: AppliedPolicy = Field(description="Limits applied.")
    image: str | None = Field(description="Image id that ran the code.")
    worker: str | None = Field(description="Worker that ran it.")
    attempt: int = Field(description="Times a worker started it.")
    transitions: list[Transition] = Field(description="Every status change, with time and actor.")
    timing: Timing = Field(description="Durations.")
    resources: Resources = Field(description="Resource use.")
    exit_code: int | None = Field(description="Exit code.")
    signal: str | None = Field(description="Ending signal.")
    error: ExecutionError | None = Field(description="Outcome, null on success.")
    artifacts: list[Artifact] = Field(description="Artifacts kept.")
    labels: dict[str, str] = Field(description="Labels.")
    origin: Origin | None = Field(None, description="The script, schedule slot or run step that started it.")

    @classmethod
    def of(cls, record: ExecutionRecord) -> RunRecord:
        return cls(
            **record.model_dump(include={"id", "trace_id", "status", "language", "request_sha256", "policy", "image",
                                         "worker", "attempt", "transitions", "timing", "resources", "exit_code",
                                         "signal", "error", "artifacts", "labels", "origin"}),
            code_sha256=hashlib.sha256(record.code.encode()).hexdigest(),
            env_names=sorted(record.env),
            input_files=record.files,
            stdin_bytes=len(base64.b64decode(record.stdin_b64)),
        )  # fmt: skip
