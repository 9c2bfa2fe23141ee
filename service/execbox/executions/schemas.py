"""An execution on the wire: the request (ExecutionCreate) and the view clients get (ExecutionPublic)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from execbox.catalog.schemas import AppliedPolicy, PolicyRequest
from execbox.executions.effects import EffectDeclaration, EffectState
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.files.schemas import check_input_path

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EXECUTION_ID_PATTERN = r"^exe_[a-z0-9]{26}$"
_STRICT = ConfigDict(extra="forbid")
RESERVED_LABEL_PREFIX = "execbox."
"""Label keys beginning so (in any case) are the service's: no request may set one."""


def _label_key(key: str) -> str:
    if key.lower().startswith(RESERVED_LABEL_PREFIX):
        raise ValueError(
            f"the {RESERVED_LABEL_PREFIX!r} label namespace is reserved for the service (the script, schedule "
            "and run an execution belongs to are shown in its `origin`); choose a key without that prefix"
        )
    return key


Labels = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_label_key)],
        Annotated[str, Field(max_length=256)],
    ],
    Field(description="Free-form labels (keys 1-64 characters, not beginning `execbox.`; values ≤ 256)."),
]
"""The labels of every request that carries some: each surface gives its own count with `max_length`.
Stored records and views keep plain `dict[str, str]`, so records written before a rule still load."""


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


class StoredWebhook(BaseModel):
    """A webhook as records keep it: read back as it was accepted, whatever later requests must meet
    (a stricter check on requests never makes a stored record unreadable)."""

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


class Webhook(StoredWebhook):
    """Where to POST the finished execution, signed with the client's secret."""

    @field_validator("url")
    @classmethod
    def _sendable(cls, url: str) -> str:
        """Refused here rather than failing at every delivery: a URL no request can be made of."""
        try:
            httpx.URL(url)
            urlsplit(url).port  # noqa: B018 (raises on a port out of range)
        except (httpx.InvalidURL, ValueError) as exc:
            raise ValueError(f"no request can be sent to this URL ({exc}); give a plain http(s) URL") from None
        return url


class WebhookDelivery(BaseModel):
    attempt: int = Field(description="1 for the first try.")
    at: float = Field(description="Unix time of the attempt.")
    status_code: int | None = Field(None, description="The receiver's answer, if any.")
    error: str | None = Field(None, description="Why the attempt failed, if it did.")


SESSION_CONTEXT_PATTERN = r"^(python|javascript|bash)(:[a-z0-9][a-z0-9-]{0,39})?$"
"""A session context's name: its language, and after a colon a name of its own (none: the language's default)."""


class ExecutionCreate(EffectDeclaration):
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
    labels: Labels = Field(
        default_factory=dict,
        max_length=16,
        description="Free-form labels stored with the execution (keys ≤ 64 chars, not beginning `execbox.`; "
        "values ≤ 256).",
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
    session: str | None = Field(
        None,
        pattern=r"^ses_[a-z2-7]{26}$",
        description="Run in this session (POST /v1/sessions): after the session's earlier executions, with its "
        "workspace and interpreter state. Only `policy.timeout_s` may be set; the other limits are the session's.",
    )
    session_context: str | None = Field(
        None,
        pattern=SESSION_CONTEXT_PATTERN,
        description="In a session: the context the cell runs in, made on first use; GET /v1/languages lists "
        "the ones a language's sessions offer. `python` (the default) is the session's own namespace; "
        "`python:<name>` another namespace of the same interpreter (its own variables and working directory, "
        "the same files); `javascript[:<name>]` a Node.js context whose top-level declarations carry from "
        "one cell to the next; `bash[:<name>]` a shell whose variables, functions and working directory do.",
    )

    @field_validator("session_context")
    @classmethod
    def _in_a_session(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("session") is None:
            raise ValueError("a context is for a cell in a session: give `session` too")
        return value

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
        return check_env(value)


def check_env(value: dict[str, str]) -> dict[str, str]:
    """An environment a client asks for: names a program can read, none of the service's own, values
    a process can hold. Every request model with an `env` checks it here."""
    for name, val in value.items():
        if not re.match(ENV_NAME_PATTERN, name):
            raise ValueError(f"env name {name!r} must match {ENV_NAME_PATTERN}")
        if name.upper().startswith("EXECBOX_"):
            raise ValueError(f"env name {name!r}: the EXECBOX_ prefix is reserved")
        if len(val) > 4096 or "\x00" in val:
            raise ValueError(f"env {name}: values are at most 4096 characters, without NUL")
    return value


class Origin(BaseModel):
    """What in the service started an execution. Only the service sets it (the script library, the
    scheduler, the plan executor); no request model has the field, so a client cannot claim a link."""

    script: str | None = Field(None, description="`name@version` of the script version it runs.")
    script_sha256: str | None = Field(None, description="That version's registration digest (its exact content).")
    shared_script: bool = Field(False, description="The script is the operator's shared one.")
    schedule: str | None = Field(None, description="The schedule that fired it.")
    slot: float | None = Field(None, description="The slot it was fired for (Unix time).")
    run: str | None = Field(None, description="The plan run it is a step attempt or check of.")
    step: str | None = Field(None, description="That run's step.")


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


class ResultData(BaseModel):
    media_type: str = Field(description="The representation's media type, e.g. image/png.")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 of the bytes, hex.")
    url: str = Field(description="Where to download it: GET /v1/executions/{id}/results/{file}.")
    text: str | None = Field(None, description="The content itself, for text and JSON representations up to 64 KiB.")


class RichResult(BaseModel):
    kind: str = Field(description="`execute_result` (the last expression's value) or `display_data` (display(), "
                      "a figure shown with plt.show()).")  # fmt: skip
    data: dict[str, ResultData] = Field(description="Its representations, by media type.")


class Transition(BaseModel):
    status: ExecutionStatus = Field(description="Status entered.")
    at: float = Field(description="Unix time, seconds.")
    by: str = Field(description="Who made the transition: api, a worker name, or the reaper.")


class ExecutionPublic(EffectState):
    """An execution as clients see it."""

    id: str = Field(description="Execution id, `exe_` followed by 26 characters.")
    status: ExecutionStatus = Field(description="Lifecycle status.")
    language: str = Field(description="Canonical language name.")
    trace_id: str = Field(description="W3C trace id (32 hex characters).")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels from the request.")
    origin: Origin | None = Field(
        None, description="Set by the service when a script invocation, a schedule or a plan run started it."
    )
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
    results: list[RichResult] = Field(
        default_factory=list,
        description="Rich results in order (sessions): the last expression's value and each display() or "
        "plt.show(), with text/plain and, when the object has them, text/html, image/png, application/json.",
    )
    session: str | None = Field(None, description="The session it ran in, if any.")
    session_context: str | None = Field(None, description="The session's context it ran in (None: the default).")
    kernel_restarted: bool = Field(
        False, description="In a session: the interpreter was restarted after this execution (its variables are gone)."
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
    node: str | None = Field(None, description="The node (host) the worker that ran it runs on (EXECBOX_WORKER__NODE).")
    webhook_deliveries: list[WebhookDelivery] = Field(
        default_factory=list, description="Every attempt to deliver the webhook, in order."
    )
    attempt: int = Field(0, description="How many times a worker started it (0 while queued).")
