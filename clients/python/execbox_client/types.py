"""The JSON the execbox API answers with, as TypedDicts: what each endpoint method of the client returns.

Written from the server's response models (its OpenAPI document, `create_app(settings).openapi()`), one
TypedDict per component schema and under its name; a field the schema does not list as required is
`NotRequired` (a server of another version may leave it out). The answers stay plain dicts at run time: these
only tell a type checker and a reader what is in them. tests/unit/test_client_types.py checks every class here
against the document, so the two cannot drift.

No `from __future__ import annotations` here: a TypedDict reads `NotRequired` from its annotations when the class
is made, which it cannot from strings (Python 3.11), so each class comes after the ones it names.
"""

from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "AppliedPolicy", "ApprovalPublic", "ApprovalStatus", "Artifact", "ArtifactNotKept", "Budgets",
    "CompensationRun", "EffectIdempotency", "ErrorCategory", "ExecutionError", "ExecutionPublic", "ExecutionStatus",
    "FilePublic", "Firing", "Handoff", "HandoffStep", "InputFile", "InputFileRef", "InputWait", "LanguagePublic",
    "LanguagesPublic", "ModelCall", "NetworkAllowlist", "NetworkDenial", "NetworkReport", "Origin", "PolicyRequest",
    "Resources", "ResultData", "RichResult", "RoleUsage", "RunEvent", "RunPublic", "RunRecord", "RunStatus",
    "RuntimePublic", "Schedule", "ScriptDetail", "ScriptSummary", "ScriptVersion", "SessionEnd", "SessionList",
    "SessionPublic", "SessionStatus", "ShownCode", "ShownFile", "StatusCheck", "StepError", "StepState", "StepStatus",
    "StoredWebhook", "Surprise", "Timing", "Transition", "Undo", "Usage", "Validation", "VersionStatus", "VersionView",
    "WebhookDelivery",
]  # fmt: skip

ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "withdrawn"]

ErrorCategory = Literal[
    "code.exit_nonzero",
    "code.exception",
    "code.syntax",
    "limit.timeout",
    "limit.cpu",
    "limit.memory",
    "limit.pids",
    "limit.output",
    "limit.disk",
    "limit.artifacts",
    "policy.network_denied",
    "check.failed",
    "output.invalid",
    "sandbox.error",
    "cancelled",
    "expired",
    "outcome.unknown",
    "approval.rejected",
    "approval.expired",
]

ExecutionStatus = Literal[
    "queued", "running", "succeeded", "failed", "cancelled", "expired", "awaiting_approval", "unknown_outcome"
]

RunStatus = Literal[
    "running", "awaiting_approval", "awaiting_input", "needs_replan", "goal_failed", "succeeded", "failed", "cancelled"
]

SessionEnd = Literal["deleted", "idle_timeout", "max_lifetime", "worker_lost", "sandbox_error"]

SessionStatus = Literal["starting", "ready", "ended"]

StepStatus = Literal[
    "pending",
    "awaiting_approval",
    "awaiting_input",
    "running",
    "succeeded",
    "failed",
    "upstream_failed",
    "unknown_outcome",
    "cancelled",
    "superseded",
]

VersionStatus = Literal["draft", "proven", "deprecated"]


class NetworkAllowlist(TypedDict):
    """Network through the egress proxy, to these hosts only."""

    mode: Literal["allowlist"]
    allow: list[str]


class AppliedPolicy(TypedDict):
    """The limits an execution actually ran with."""

    name: str
    timeout_s: float
    cpu: float
    cpu_time_s: int
    memory_mb: int
    pids: int
    disk_mb: int
    output_bytes: int
    queue_timeout_s: float
    network: Literal["none"] | NetworkAllowlist
    runtime: NotRequired[str | None]
    seccomp_deny: NotRequired[list[str]]
    code_bytes: int
    stdin_bytes: int
    input_files: int
    input_file_bytes: int
    input_total_bytes: int
    artifact_files: int
    artifact_file_bytes: int
    artifact_total_bytes: int


class ShownCode(TypedDict):
    role: Literal["precondition", "status_check", "compensation"]
    name: NotRequired[str]
    language: str
    code: str
    args: NotRequired[dict[str, Any]]


class ShownFile(TypedDict):
    path: str
    size: NotRequired[int | None]
    sha256: NotRequired[str | None]
    source: str


class ApprovalPublic(TypedDict):
    id: str
    run_id: NotRequired[str | None]
    step_id: NotRequired[str | None]
    execution_id: NotRequired[str | None]
    status: ApprovalStatus
    summary: NotRequired[str]
    args: NotRequired[dict[str, Any]]
    code: str
    requested_at: float
    expires_at: float
    decided_at: NotRequired[float | None]
    decided_by: NotRequired[str | None]
    by: NotRequired[list[str]]
    reason: NotRequired[str | None]
    tenant: str
    language: NotRequired[str | None]
    inputs: NotRequired[Any]
    env_sha256: NotRequired[dict[str, str]]
    stdin_bytes: NotRequired[int]
    stdin_sha256: NotRequired[str | None]
    files: NotRequired[list[ShownFile]]
    network: NotRequired[Literal["none"] | NetworkAllowlist | None]
    policy: NotRequired[str | None]
    also_runs: NotRequired[list[ShownCode]]
    required_by: NotRequired[str | None]


class Artifact(TypedDict):
    name: str
    size: int
    sha256: str
    media_type: str
    url: str


class ArtifactNotKept(TypedDict):
    name: str
    size: NotRequired[int | None]
    reason: str


class Budgets(TypedDict):
    max_steps: NotRequired[int]
    max_parallel: NotRequired[int]
    max_replans: NotRequired[int]
    max_wall_s: NotRequired[float]
    max_tokens: NotRequired[int | None]
    max_cost_usd: NotRequired[float | None]


class ExecutionError(TypedDict):
    """Why an execution did not succeed."""

    category: ErrorCategory
    message: str
    retryable: bool
    details: NotRequired[dict[str, Any]]


class Origin(TypedDict):
    """What in the service started an execution. Only the service sets it (the script library, the scheduler,
    the plan executor); no request model has the field, so a client cannot claim a link.
    """

    script: NotRequired[str | None]
    script_sha256: NotRequired[str | None]
    shared_script: NotRequired[bool]
    schedule: NotRequired[str | None]
    slot: NotRequired[float | None]
    run: NotRequired[str | None]
    step: NotRequired[str | None]


class ResultData(TypedDict):
    media_type: str
    size: int
    sha256: str
    url: str
    text: NotRequired[str | None]


class RichResult(TypedDict):
    kind: str
    data: dict[str, ResultData]


class Timing(TypedDict):
    queue_wait_ms: NotRequired[float | None]
    sandbox_start_ms: NotRequired[float | None]
    warm_start: NotRequired[bool | None]
    run_ms: NotRequired[float | None]
    collect_ms: NotRequired[float | None]
    total_ms: NotRequired[float | None]


class Resources(TypedDict):
    peak_memory_bytes: NotRequired[int | None]
    oom_killed: NotRequired[bool]


class NetworkDenial(TypedDict):
    host: str
    port: int
    at: float
    reason: str
    trace_id: NotRequired[str | None]


class NetworkReport(TypedDict):
    denied: NotRequired[list[NetworkDenial]]


class WebhookDelivery(TypedDict):
    attempt: int
    at: float
    status_code: NotRequired[int | None]
    error: NotRequired[str | None]


class StatusCheck(TypedDict):
    """Read-only code that tells whether an execution's effect happened: its declared outputs
    satisfy `expect` when it did. It gets the execution's inputs, files and idempotency key."""

    name: NotRequired[str]
    code: str
    language: NotRequired[str]
    expect: dict[str, Any]


class EffectIdempotency(TypedDict):
    """How a write execution may be repeated after an attempt whose outcome is unknown."""

    strategy: Literal["key", "status_read", "none"]
    key: NotRequired[str | None]
    status_check: NotRequired[StatusCheck | None]


class ExecutionPublic(TypedDict):
    """An execution as clients see it."""

    id: str
    status: ExecutionStatus
    language: str
    trace_id: str
    labels: NotRequired[dict[str, str]]
    origin: NotRequired[Origin | None]
    created_at: float
    started_at: NotRequired[float | None]
    finished_at: NotRequired[float | None]
    exit_code: NotRequired[int | None]
    signal: NotRequired[str | None]
    stdout: NotRequired[str]
    stderr: NotRequired[str]
    stdout_truncated: NotRequired[bool]
    stderr_truncated: NotRequired[bool]
    stdout_bytes: NotRequired[int]
    stderr_bytes: NotRequired[int]
    stdout_encoding: NotRequired[Literal["utf-8", "base64"]]
    stderr_encoding: NotRequired[Literal["utf-8", "base64"]]
    artifacts: NotRequired[list[Artifact]]
    artifacts_not_kept: NotRequired[list[ArtifactNotKept]]
    results: NotRequired[list[RichResult]]
    session: NotRequired[str | None]
    session_context: NotRequired[str | None]
    kernel_restarted: NotRequired[bool]
    outputs: NotRequired[dict[str, Any]]
    error: NotRequired[ExecutionError | None]
    timing: NotRequired[Timing]
    resources: NotRequired[Resources]
    network: NotRequired[NetworkReport | None]
    policy: AppliedPolicy
    image: NotRequired[str | None]
    worker: NotRequired[str | None]
    node: NotRequired[str | None]
    webhook_deliveries: NotRequired[list[WebhookDelivery]]
    attempt: NotRequired[int]
    effect: NotRequired[Literal["read", "write"] | None]
    idempotency: NotRequired[EffectIdempotency | None]
    approval_id: NotRequired[str | None]
    code_runs: NotRequired[int]
    phase: NotRequired[Literal["status_read"] | None]
    side_effects: NotRequired[Literal["none", "possible", "unknown"] | None]
    reconciled: NotRequired[str | None]


class FilePublic(TypedDict):
    """An uploaded file, usable by id in many executions until it expires."""

    id: str
    name: str
    size: int
    sha256: str
    created_at: float
    expires_at: float
    tenant: NotRequired[str]


class Firing(TypedDict):
    slot: float
    at: float
    status: Literal["fired", "queued", "skipped_overlap", "skipped_misfire", "not_started"]
    execution_id: NotRequired[str | None]
    lag_s: NotRequired[float | None]
    detail: NotRequired[str]


class StepError(TypedDict):
    """Why a step did not succeed: its execution's error, or the run's own reason."""

    category: str
    message: str
    retryable: NotRequired[bool]
    details: NotRequired[dict[str, Any]]


class HandoffStep(TypedDict):
    step_id: str
    status: StepStatus
    code: NotRequired[str | None]
    args: NotRequired[dict[str, Any] | None]
    outputs: NotRequired[dict[str, Any] | None]
    artifacts: NotRequired[list[str]]
    attempts: NotRequired[int]
    error: NotRequired[StepError | None]
    stdout_tail: NotRequired[str | None]
    stderr_tail: NotRequired[str | None]
    side_effects: NotRequired[str | None]
    blocked_by: NotRequired[list[str]]
    fallback_from: NotRequired[StepError | None]


class RoleUsage(TypedDict):
    calls: NotRequired[int]
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    cost_usd: NotRequired[float]
    latency_ms: NotRequired[float]


class Usage(TypedDict):
    steps_dispatched: NotRequired[int]
    replans: NotRequired[int]
    tokens: NotRequired[int]
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    cost_usd: NotRequired[float]
    model_calls: NotRequired[int]
    latency_ms: NotRequired[float]
    by_role: NotRequired[dict[str, RoleUsage]]
    unlisted_calls: NotRequired[int]


class ModelCall(TypedDict):
    model: NotRequired[str]
    role: NotRequired[str]
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    cost_usd: NotRequired[float]
    latency_ms: NotRequired[float | None]
    call_id: NotRequired[str | None]
    at: float


class InputWait(TypedDict):
    """An input step's request, once asked: what the supplier needs (the step's `args` are its
    context, resolved), until when, and who supplied it."""

    summary: NotRequired[str]
    schema: dict[str, Any]
    expires_at: float
    by: NotRequired[list[str]]
    supplied_by: NotRequired[str | None]
    supplied_at: NotRequired[float | None]


class Handoff(TypedDict):
    """What a re-planner needs: what is done, what failed and why, what that invalidated, what remains."""

    format: NotRequired[Literal["handoff/v1"]]
    run_id: str
    revision: int
    objective: str
    status: RunStatus
    reason: str | None
    completed: list[HandoffStep]
    failed: list[HandoffStep]
    unknown_outcomes: list[HandoffStep]
    invalidated: list[HandoffStep]
    remaining: list[HandoffStep]
    budgets: Budgets
    usage: Usage
    constraints: list[str]
    revise: dict[str, Any]


class InputFile(TypedDict):
    """A file placed in the working directory before the program starts."""

    path: str
    content_b64: NotRequired[str | None]
    file_id: NotRequired[str | None]


class InputFileRef(TypedDict):
    path: str
    file_id: str
    size: int
    sha256: str


class RuntimePublic(TypedDict):
    name: str
    version: str


class LanguagePublic(TypedDict):
    name: str
    language: str
    variant: str | None
    version: str
    aliases: list[str]
    image: str
    file: str
    sessions: bool
    session_contexts: NotRequired[list[str]]
    runtime: RuntimePublic | None
    packages: dict[str, str] | None


class LanguagesPublic(TypedDict):
    languages: list[LanguagePublic]


class PolicyRequest(TypedDict):
    """Limits asked for by the client; each is checked against the named policy's ceiling."""

    name: NotRequired[str | None]
    timeout_s: NotRequired[float | None]
    cpu: NotRequired[float | None]
    cpu_time_s: NotRequired[int | None]
    memory_mb: NotRequired[int | None]
    pids: NotRequired[int | None]
    disk_mb: NotRequired[int | None]
    output_bytes: NotRequired[int | None]
    queue_timeout_s: NotRequired[float | None]
    runtime: NotRequired[Literal["runc", "runsc", "bwrap"] | None]
    network: NotRequired[Literal["none"] | NetworkAllowlist | None]
    stdin_bytes: NotRequired[int | None]
    input_files: NotRequired[int | None]
    input_file_bytes: NotRequired[int | None]
    input_total_bytes: NotRequired[int | None]
    artifact_files: NotRequired[int | None]
    artifact_file_bytes: NotRequired[int | None]
    artifact_total_bytes: NotRequired[int | None]


class RunEvent(TypedDict):
    at: float
    type: str
    step: NotRequired[str | None]
    status: NotRequired[str | None]
    detail: NotRequired[str]


class Undo(TypedDict):
    """A step's compensation (`skipped`: none declared, or its outcome is unknown)."""

    status: NotRequired[Literal["pending", "running", "done", "failed", "skipped"]]
    execution: NotRequired[str | None]
    reason: NotRequired[str | None]


class CompensationRun(TypedDict):
    """A run's writes undone one at a time, in reverse dependency order."""

    status: Literal["running", "completed", "stopped"]
    reason: NotRequired[str]
    requested_at: float
    order: NotRequired[list[str]]


class StepState(TypedDict):
    status: NotRequired[StepStatus]
    revision: int
    attempts: NotRequired[list[str]]
    outputs: NotRequired[dict[str, Any] | None]
    error: NotRequired[StepError | None]
    side_effects: NotRequired[Literal["none", "possible", "unknown"] | None]
    blocked_by: NotRequired[list[str]]
    approval_id: NotRequired[str | None]
    due_at: NotRequired[float | None]
    args: NotRequired[dict[str, Any] | None]
    reconciled: NotRequired[str | None]
    approval_required: NotRequired[bool]
    script: NotRequired[str | None]
    checks: NotRequired[list[str]]
    phase: NotRequired[str | None]
    passed: NotRequired[int]
    key: NotRequired[str | None]
    undo: NotRequired[Undo | None]
    input: NotRequired[InputWait | None]
    fallback_from: NotRequired[StepError | None]
    fallback_at: NotRequired[int | None]
    may_have_applied: NotRequired[bool]


class RunPublic(TypedDict):
    id: str
    status: RunStatus
    stop_reason: NotRequired[str | None]
    revision: int
    objective: NotRequired[str]
    labels: NotRequired[dict[str, str]]
    trace_id: str
    created_at: float
    finished_at: NotRequired[float | None]
    budgets: Budgets
    usage: NotRequired[Usage]
    model_calls: NotRequired[list[ModelCall]]
    steps: dict[str, StepState]
    compensation: NotRequired[CompensationRun | None]
    events: NotRequired[list[RunEvent]]


class Transition(TypedDict):
    status: ExecutionStatus
    at: float
    by: str


class RunRecord(TypedDict):
    """Everything needed to reproduce or diagnose one run."""

    id: str
    trace_id: str
    status: ExecutionStatus
    language: str
    request_sha256: str
    code_sha256: str
    env_names: list[str]
    input_files: list[InputFileRef]
    stdin_bytes: int
    policy: AppliedPolicy
    image: str | None
    worker: str | None
    attempt: int
    transitions: list[Transition]
    timing: Timing
    resources: Resources
    exit_code: int | None
    signal: str | None
    error: ExecutionError | None
    artifacts: list[Artifact]
    labels: dict[str, str]
    origin: NotRequired[Origin | None]


class StoredWebhook(TypedDict):
    """A webhook as records keep it: read back as it was accepted, whatever later requests must meet (a stricter
    check on requests never makes a stored record unreadable).
    """

    url: str
    secret: str


class Schedule(TypedDict):
    script: str
    inputs: NotRequired[dict[str, Any]]
    files: NotRequired[list[InputFile]]
    cron: str
    timezone: NotRequired[str]
    overlap: NotRequired[Literal["skip", "queue_one"]]
    misfire: NotRequired[Literal["skip", "fire_latest"]]
    misfire_grace_s: NotRequired[float]
    labels: NotRequired[dict[str, str]]
    notify: NotRequired[Literal["failures", "all"]]
    webhook: NotRequired[StoredWebhook | None]
    id: str
    tenant: str
    paused: NotRequired[bool]
    created_at: float
    last_slot: float
    queued_slot: NotRequired[float | None]
    last_execution: NotRequired[str | None]
    queue: NotRequired[str]


class VersionView(TypedDict):
    version: str
    status: VersionStatus
    sha256: str
    created_at: float
    evidence: list[str]
    uses: int


class ScriptDetail(TypedDict):
    name: str
    versions: list[VersionView]


class ScriptSummary(TypedDict):
    name: str
    description: str
    tags: list[str]
    latest: str
    proven: NotRequired[str | None]
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    shared: NotRequired[bool]


class ScriptVersion(TypedDict):
    """A stored version: the registration plus its status, evidence and use."""

    name: str
    version: str
    language: NotRequired[str]
    code: str
    description: NotRequired[str]
    tags: NotRequired[list[str]]
    input_schema: NotRequired[dict[str, Any]]
    output_schema: NotRequired[dict[str, Any]]
    default_policy: NotRequired[PolicyRequest]
    input_files: NotRequired[list[str]]
    status: NotRequired[VersionStatus]
    sha256: str
    created_at: float
    evidence: NotRequired[list[str]]
    tenant: str


class SessionPublic(TypedDict):
    id: str
    status: SessionStatus
    language: str
    labels: NotRequired[dict[str, str]]
    created_at: float
    ready_at: NotRequired[float | None]
    ended_at: NotRequired[float | None]
    expires_at: float
    idle_timeout_s: int
    max_lifetime_s: int
    last_activity_at: float
    executions: NotRequired[int]
    running: NotRequired[str | None]
    kernel_restarts: NotRequired[int]
    end_reason: NotRequired[SessionEnd | None]
    error: NotRequired[ExecutionError | None]
    policy: AppliedPolicy


class SessionList(TypedDict):
    sessions: list[SessionPublic]


class Surprise(TypedDict):
    id: NotRequired[str]
    type: NotRequired[str]
    at: float
    script: str
    schedule: NotRequired[str | None]
    slot: NotRequired[float | None]
    execution_id: str
    error: NotRequired[ExecutionError | None]
    stdout_tail: NotRequired[str]
    stderr_tail: NotRequired[str]
    outputs: NotRequired[dict[str, Any] | None]
    artifacts: NotRequired[list[str]]
    inputs: NotRequired[Any]
    links: NotRequired[dict[str, str]]


class Validation(TypedDict):
    valid: bool
    steps: int
