"""Wire models (pydantic) and the two stable enums: lifecycle status and error category."""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EXECUTION_ID_PATTERN = r"^exe_[a-z0-9]{26}$"


class ExecutionStatus(enum.StrEnum):
    """Lifecycle: queued → running → succeeded | failed | cancelled | expired. Values never change."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self not in (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING)


class ErrorCategory(enum.StrEnum):
    """Why an execution did not succeed. A fixed, documented enum: never rename or reuse a value."""

    CODE_EXIT_NONZERO = "code.exit_nonzero"
    CODE_EXCEPTION = "code.exception"
    CODE_SYNTAX = "code.syntax"
    LIMIT_TIMEOUT = "limit.timeout"
    LIMIT_CPU = "limit.cpu"
    LIMIT_MEMORY = "limit.memory"
    LIMIT_PIDS = "limit.pids"
    LIMIT_OUTPUT = "limit.output"
    LIMIT_DISK = "limit.disk"
    LIMIT_ARTIFACTS = "limit.artifacts"
    POLICY_NETWORK_DENIED = "policy.network_denied"
    CHECK_FAILED = "check.failed"
    OUTPUT_INVALID = "output.invalid"
    SANDBOX_ERROR = "sandbox.error"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


_STRICT = ConfigDict(extra="forbid")


class NetworkAllowlist(BaseModel):
    """Network through the egress proxy, to these hosts only."""

    model_config = _STRICT

    mode: Literal["allowlist"] = Field(description="`allowlist`: HTTP(S) through the egress proxy, nothing else.")
    allow: list[str] = Field(
        min_length=1,
        max_length=64,
        description="Host patterns: `api.example.com`, `*.pypi.org` (names under pypi.org), optionally with "
        "`:port` (without a port: 80 and 443). Each must be covered by the named policy's `network_allow`.",
    )

    @field_validator("allow")
    @classmethod
    def _patterns(cls, allow: list[str]) -> list[str]:
        from execbox.egress.rules import HostPattern

        return [str(HostPattern.parse(pattern)) for pattern in allow]


class PolicyRequest(BaseModel):
    """Limits asked for by the client; each is checked against the named policy's ceiling."""

    model_config = _STRICT

    name: str | None = Field(
        None, max_length=64, description="Named server policy (policies/<name>.yaml); default: `default`."
    )
    timeout_s: float | None = Field(None, gt=0, le=86400, description="Wall-clock limit of the run, seconds.")
    cpu: float | None = Field(None, gt=0, le=256, description="CPU quota in cores (fractions allowed).")
    cpu_time_s: int | None = Field(None, gt=0, le=86400, description="CPU-time limit per process, seconds.")
    memory_mb: int | None = Field(None, ge=16, le=1 << 20, description="Memory limit (swap included), MiB.")
    pids: int | None = Field(None, ge=8, le=1 << 16, description="Largest number of processes and threads.")
    disk_mb: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="Writable space (/workspace and /tmp each), MiB; also the largest file the program may write.",
    )
    output_bytes: int | None = Field(
        None,
        ge=1024,
        le=1 << 30,
        description="Cap of stdout and of stderr, bytes each; the program is stopped when one passes it.",
    )
    queue_timeout_s: float | None = Field(
        None, gt=0, le=86400, description="How long the execution may wait in the queue before it becomes `expired`."
    )
    runtime: Literal["runc", "runsc"] | None = Field(
        None,
        description="OCI runtime: `runc` (the default) or `runsc` (gVisor: a second kernel boundary; 422 when no "
        "worker has it). The named policy may set a default.",
    )
    network: Literal["none"] | NetworkAllowlist | None = Field(
        None,
        description="Network access: `none` (the default: no interface but loopback) or "
        '`{"mode": "allowlist", "allow": [...]}` (HTTP and HTTPS to those hosts through the egress proxy).',
    )
    stdin_bytes: int | None = Field(None, ge=0, le=1 << 30, description="Largest stdin accepted, bytes.")
    input_files: int | None = Field(None, ge=0, le=100000, description="Most input files per execution.")
    input_file_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest input file, bytes.")
    input_total_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest total of input files, bytes.")
    artifact_files: int | None = Field(None, ge=0, le=100000, description="Most artifacts kept.")
    artifact_file_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest artifact kept, bytes.")
    artifact_total_bytes: int | None = Field(
        None, ge=0, le=1 << 34, description="Largest total of artifacts kept, bytes."
    )


class AppliedPolicy(BaseModel):
    """The limits an execution actually ran with."""

    name: str = Field(description="Named policy the limits came from.")
    timeout_s: float = Field(description="Wall-clock limit, seconds.")
    cpu: float = Field(description="CPU quota, cores.")
    cpu_time_s: int = Field(description="CPU-time limit per process, seconds.")
    memory_mb: int = Field(description="Memory limit (swap included), MiB.")
    pids: int = Field(description="Process/thread limit.")
    disk_mb: int = Field(description="Writable space per scratch mount and largest file, MiB.")
    output_bytes: int = Field(description="Cap of each output stream, bytes.")
    queue_timeout_s: float = Field(description="Queue deadline, seconds after submission.")
    network: Literal["none"] | NetworkAllowlist = Field(description="Network access.")
    runtime: str | None = Field(
        None,
        description="OCI runtime (runc, runsc); set by the worker that takes the run when the request and "
        "policy left it to the operator's default.",
    )
    seccomp_deny: list[str] = Field(
        default_factory=list, description="System calls the named policy denies on top of execbox's seccomp profile."
    )
    code_bytes: int = Field(description="Largest code accepted, bytes.")
    stdin_bytes: int = Field(description="Largest stdin accepted, bytes.")
    input_files: int = Field(description="Most input files.")
    input_file_bytes: int = Field(description="Largest input file, bytes.")
    input_total_bytes: int = Field(description="Largest total of input files, bytes.")
    artifact_files: int = Field(description="Most artifacts kept.")
    artifact_file_bytes: int = Field(description="Largest artifact kept, bytes.")
    artifact_total_bytes: int = Field(description="Largest total of artifacts kept, bytes.")


INPUT_PATH_PATTERN = r"^(?!/)(?!.*(?:^|/)\.{1,2}(?:/|$))(?!.*//)[^\x00-\x1f\x7f\\]{1,1024}$"
RESERVED_PATHS = (".execbox", "out/.execbox")


def check_input_path(path: str) -> str:
    """A relative path under /workspace: no absolute path, `..`, `.`, empty part, NUL or control character."""
    import re

    if not re.match(INPUT_PATH_PATTERN, path):
        raise ValueError(
            f"path {path!r} must be relative to the working directory, without '..', '.', empty parts, "
            "a leading '/', backslashes or control characters"
        )
    if any(path == r or path.startswith(r + "/") for r in RESERVED_PATHS):
        raise ValueError(f"path {path!r} is inside a directory execbox reserves ({', '.join(RESERVED_PATHS)})")
    if any(len(part) > 255 for part in path.split("/")):
        raise ValueError(f"path {path!r} has a part longer than 255 characters")
    return path


class InputFile(BaseModel):
    """A file placed in the working directory before the program starts."""

    model_config = _STRICT

    path: str = Field(description="Path relative to the working directory, e.g. `data/sales.csv`.")
    content_b64: str | None = Field(None, description="The file's bytes, base64-encoded (give this or file_id).")
    file_id: str | None = Field(
        None,
        pattern=r"^file_[a-z0-9]{26}$",
        description="Id of a file uploaded with POST /v1/files (give this or content_b64).",
    )

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_input_path(value)

    @model_validator(mode="after")
    def _one_source(self) -> InputFile:
        if (self.content_b64 is None) == (self.file_id is None):
            raise ValueError("give exactly one of content_b64 and file_id")
        return self


class OutputsSpec(BaseModel):
    model_config = _STRICT

    files: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Glob patterns (fnmatch, "
        "relative to the working directory) naming the files to return as artifacts "
        "instead of everything under out/.",
    )


class Expect(BaseModel):
    """What the run must produce; an unmet expectation fails it with output.invalid."""

    model_config = _STRICT

    exit_code: int | None = Field(
        None, ge=0, le=255, description="The exit code the program must end with (0 unless given)."
    )
    artifacts: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Names or glob patterns; each must match at least one kept artifact.",
    )
    outputs_schema: dict[str, Any] | None = Field(
        None, description="JSON Schema the declared outputs object must satisfy."
    )

    @field_validator("outputs_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            try:
                Draft202012Validator.check_schema(value)
            except SchemaError as exc:
                raise ValueError(f"not a valid JSON Schema: {exc.message}") from exc
        return value


class Webhook(BaseModel):
    """Where to POST the finished execution, signed with the client's secret."""

    model_config = _STRICT

    url: str = Field(
        max_length=2048,
        pattern=r"^https?://[^\s/$.?#][^\s]*$",
        description="http(s) URL whose host the operator allows (EXECBOX_WEBHOOKS__ALLOW_HOSTS).",
    )
    secret: str = Field(
        min_length=16,
        max_length=256,
        description="Shared secret for the `Execbox-Signature` "
        "header: `t=<unix time>,v1=<hex HMAC-SHA256(secret, '<t>.' + body)>`.",
    )


class WebhookDelivery(BaseModel):
    attempt: int = Field(description="1 for the first try.")
    at: float = Field(description="Unix time of the attempt.")
    status_code: int | None = Field(None, description="The receiver's answer, if any.")
    error: str | None = Field(None, description="Why the attempt failed, if it did.")


class ExecutionCreate(BaseModel):
    """A request to run code once in a fresh sandbox."""

    model_config = _STRICT

    language: str = Field(min_length=1, max_length=64, description="Language name or alias (GET /v1/languages).")
    code: str = Field(
        min_length=1, description="Program source, UTF-8. Its size is capped by the policy's `code_bytes`."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra environment variables for the program (names: letters, digits, underscore; values ≤ 4 KiB).",
    )
    policy: PolicyRequest = Field(
        default_factory=PolicyRequest, description="Resource limits; omitted ones take the named policy's defaults."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Free-form labels stored with the execution (keys ≤ 64 chars, values ≤ 256).",
    )
    files: list[InputFile] = Field(
        default_factory=list, description="Input files, written under the working directory before the program starts."
    )
    stdin: str | None = Field(None, description="Text fed to the program's standard input (UTF-8).")
    stdin_b64: str | None = Field(None, description="Bytes fed to standard input, base64-encoded (instead of `stdin`).")
    inputs: Any = Field(
        None,
        description="Any JSON value, readable by the program as `execbox.inputs` (or the "
        "JSON file named by $EXECBOX_INPUTS_FILE).",
    )
    outputs: OutputsSpec = Field(default_factory=OutputsSpec, description="Which produced files come back.")
    expect: Expect | None = Field(None, description="Expectations the run must meet.")
    webhook: Webhook | None = Field(None, description="POST the finished execution here (retried with backoff).")

    @model_validator(mode="after")
    def _one_stdin(self) -> ExecutionCreate:
        if self.stdin is not None and self.stdin_b64 is not None:
            raise ValueError("give stdin or stdin_b64, not both")
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("two input files have the same path")
        return self

    @field_validator("code")
    @classmethod
    def _code_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("code is blank; send the program to run")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for name, val in value.items():
            if not re.match(ENV_NAME_PATTERN, name):
                raise ValueError(f"env name {name!r} must match {ENV_NAME_PATTERN}")
            if name.upper().startswith("EXECBOX_"):
                raise ValueError(f"env name {name!r}: the EXECBOX_ prefix is reserved")
            if len(val) > 4096 or "\x00" in val:
                raise ValueError(f"env {name}: values are at most 4096 characters, without NUL")
        return value

    @field_validator("labels")
    @classmethod
    def _label_sizes(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not 0 < len(key) <= 64 or len(val) > 256:
                raise ValueError("label keys are 1-64 characters and values at most 256")
        return value


class ExecutionError(BaseModel):
    """Why an execution did not succeed."""

    category: ErrorCategory = Field(description="Stable category (see docs/api.md).")
    message: str = Field(description="Human-readable explanation, saying what to do next where possible.")
    retryable: bool = Field(description="True when running the same request again may succeed.")
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="Category-specific details, e.g. the exception type, message and traceback for code.exception.",
    )


class Timing(BaseModel):
    queue_wait_ms: float | None = Field(None, description="From acceptance to a worker taking it.")
    sandbox_start_ms: float | None = Field(None, description="Creating and starting the container.")
    warm_start: bool | None = Field(None, description="The container came from the warm pool (created beforehand).")
    run_ms: float | None = Field(None, description="From container start to the program's end.")
    collect_ms: float | None = Field(None, description="Collecting the output directory after the run.")
    total_ms: float | None = Field(None, description="From acceptance to the result being stored.")


class Resources(BaseModel):
    peak_memory_bytes: int | None = Field(None, description="Highest memory use the engine reported, if any.")
    oom_killed: bool = Field(False, description="The engine reported an out-of-memory kill.")


class NetworkDenial(BaseModel):
    host: str = Field(description="Host the program tried to reach (empty when a limit cut a connection).")
    port: int = Field(description="Port it asked for.")
    at: float = Field(description="Unix time of the refusal.")
    reason: str = Field(description="Why the egress proxy refused.")
    trace_id: str | None = Field(None, description="The execution's trace id.")


class NetworkReport(BaseModel):
    denied: list[NetworkDenial] = Field(
        default_factory=list, description="Attempts the egress proxy refused (the first 100)."
    )


class Artifact(BaseModel):
    name: str = Field(description="Path relative to the output directory (or the working directory for globs).")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 of the content, hex.")
    media_type: str = Field(description="Media type guessed from the name.")
    url: str = Field(description="Where to download it: GET /v1/executions/{id}/artifacts/{name}.")


class ArtifactNotKept(BaseModel):
    name: str = Field(description="The file's name.")
    size: int | None = Field(None, description="Its size, when known.")
    reason: str = Field(description="Why it is not returned: a cap passed, a symlink or hard link, an unsafe name.")


class Transition(BaseModel):
    status: ExecutionStatus = Field(description="Status entered.")
    at: float = Field(description="Unix time, seconds.")
    by: str = Field(description="Who made the transition: api, a worker name, or the reaper.")


class ExecutionPublic(BaseModel):
    """An execution as clients see it."""

    id: str = Field(description="Execution id, `exe_` followed by 26 characters.")
    status: ExecutionStatus = Field(description="Lifecycle status.")
    language: str = Field(description="Canonical language name.")
    trace_id: str = Field(description="W3C trace id (32 hex characters).")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels from the request.")
    created_at: float = Field(description="Unix time the execution was accepted.")
    started_at: float | None = Field(None, description="Unix time a worker took it.")
    finished_at: float | None = Field(None, description="Unix time it reached a terminal status.")
    exit_code: int | None = Field(None, description="Program exit code, when it exited.")
    signal: str | None = Field(None, description="Signal that ended the program (e.g. SIGKILL), if any.")
    stdout: str = Field("", description="Standard output up to the cap: text, or base64 (see stdout_encoding).")
    stderr: str = Field("", description="Standard error, likewise.")
    stdout_truncated: bool = Field(False, description="stdout passed its cap; only the first bytes are kept.")
    stderr_truncated: bool = Field(False, description="stderr passed its cap.")
    stdout_bytes: int = Field(0, description="Bytes of stdout seen in all (kept or not).")
    stderr_bytes: int = Field(0, description="Bytes of stderr seen in all.")
    stdout_encoding: Literal["utf-8", "base64"] = Field(
        "utf-8", description="`base64` when stdout was not valid UTF-8; `stdout` then holds its bytes in base64."
    )
    stderr_encoding: Literal["utf-8", "base64"] = Field("utf-8", description="Likewise for stderr.")
    artifacts: list[Artifact] = Field(default_factory=list, description="Files produced and kept.")
    artifacts_not_kept: list[ArtifactNotKept] = Field(
        default_factory=list, description="Files produced but not returned, each with the reason."
    )
    outputs: dict[str, Any] = Field(
        default_factory=dict,
        description="Values the program declared with "
        "execbox.emit(name, value). A value too large to inline is "
        '`{"artifact": name}`.',
    )
    error: ExecutionError | None = Field(None, description="Null on success, else the categorized error.")
    timing: Timing = Field(default_factory=Timing, description="Durations of each phase.")
    resources: Resources = Field(default_factory=Resources, description="Resource use reported by the engine.")
    network: NetworkReport | None = Field(
        None, description="For executions with a network allowlist: what the egress proxy refused."
    )
    policy: AppliedPolicy = Field(description="The policy actually applied.")
    image: str | None = Field(None, description="Digest (image id) of the sandbox image that ran the code.")
    worker: str | None = Field(None, description="Name of the worker that ran it.")
    webhook_deliveries: list[WebhookDelivery] = Field(
        default_factory=list, description="Every attempt to deliver the webhook, in order."
    )
    attempt: int = Field(0, description="How many times a worker started it (0 while queued).")


class InputFileRef(BaseModel):
    path: str = Field(description="Path under the working directory.")
    file_id: str = Field(description="Stored file object.")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="SHA-256, hex.")


class FilePublic(BaseModel):
    """An uploaded file, usable by id in many executions until it expires."""

    id: str = Field(description="File id, `file_` followed by 26 characters.")
    name: str = Field(description="The uploaded file's name (informational).")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 of the content, hex.")
    created_at: float = Field(description="Unix time of the upload.")
    expires_at: float = Field(description="Unix time after which it is gone.")
    tenant: str = Field("default", description="Tenant that owns it.")


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
    webhook: Webhook | None = Field(None, description="Callback and its secret.")
    request_sha256: str = Field(description="SHA-256 of the canonical request.")
    queue_deadline: float = Field(description="Unix time after which a queued execution expires.")
    transitions: list[Transition] = Field(default_factory=list, description="Every status change.")
    cancel_requested: bool = Field(False, description="A client asked to cancel it.")

    def public(self) -> ExecutionPublic:
        return ExecutionPublic.model_validate(self.model_dump(include=set(ExecutionPublic.model_fields)))


class LanguagePublic(BaseModel):
    name: str = Field(description="Canonical language name to send as `language`.")
    version: str = Field(description="Language version in the image.")
    aliases: list[str] = Field(description="Other names accepted for it.")
    image: str = Field(description="Sandbox image tag.")
    file: str = Field(description="File name the code is saved as in /workspace.")


class LanguagesPublic(BaseModel):
    languages: list[LanguagePublic] = Field(description="Every language this service runs.")


class ProblemField(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. `policy.memory_mb` or `query.wait`.")
    message: str = Field(description="What is wrong with it and what to send instead.")


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every 4xx/5xx answer."""

    type: str = Field(description="URI naming the problem type.")
    title: str = Field(description="Short summary of the problem type.")
    status: int = Field(description="HTTP status code.")
    detail: str = Field(description="What went wrong and what to do next.")
    code: str = Field(description="Stable machine-readable code, e.g. `request.policy_exceeded`.")
    retryable: bool = Field(description="True when the same request may succeed later.")
    errors: list[ProblemField] = Field(description="One entry per invalid field (may be empty).")


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

    @classmethod
    def of(cls, record: ExecutionRecord) -> RunRecord:
        import base64
        import hashlib

        return cls(
            **record.model_dump(include={"id", "trace_id", "status", "language", "request_sha256", "policy", "image",
                                         "worker", "attempt", "transitions", "timing", "resources", "exit_code",
                                         "signal", "error", "artifacts", "labels"}),
            code_sha256=hashlib.sha256(record.code.encode()).hexdigest(),
            env_names=sorted(record.env),
            input_files=record.files,
            stdin_bytes=len(base64.b64decode(record.stdin_b64)),
        )  # fmt: skip
