"""A plan on the wire (`plan/v1`), the run that executes it, its compensation and its approvals
(and executions'); the hand-off is execbox.plans.handoff's.

A plan is a DAG of steps. Each step runs one code cell (an ordinary execution) with arguments
that may refer to the run's inputs and to earlier steps' outputs (`{"$ref": "/steps/a/outputs/x"}`)
and artifacts (`{"$artifact": "/steps/a/artifacts/report.csv"}`), never by splicing text into code.

Longer than 400 lines because the plan/v1 contract (the document, the run and step states a client
reads back, the requests that act on a run) is one vocabulary best read in one place.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from execbox.catalog.schemas import NetworkAllowlist, PolicyRequest
from execbox.executions.effects import Approval
from execbox.executions.schemas import InputFile, Labels, StoredWebhook, Webhook
from execbox.plans.refs import MAX_DEPTH, nesting
from execbox.plans.usage import ModelCall, Usage

STEP_ID_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
RUN_ID_PATTERN = r"^run_[a-z0-9]{26}$"
APPROVAL_ID_PATTERN = r"^apr_[a-z0-9]{26}$"
MAX_PLAN_STEPS = 1000
"""Most steps a plan (all its revisions together) may hold."""
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)  # a float that is not finite is stored as null


def _unset(value: object) -> bool:
    return value is None


class TransientCategory(enum.StrEnum):
    """The error categories a step may retry in place."""

    SANDBOX_ERROR = "sandbox.error"
    LIMIT_TIMEOUT = "limit.timeout"


class CodeCell(BaseModel):
    model_config = _STRICT

    code: str = Field(min_length=1, description="Program source, as for an execution.")
    language: str = Field("python", min_length=1, max_length=64, description="Language name or alias.")


class ScriptRef(BaseModel):
    model_config = _STRICT

    script: str = Field(
        max_length=200,
        pattern=r"^[a-z][a-z0-9_.-]{0,99}@(proven|\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?)$",
        description="`name@version` of a registered script, or `name@proven` (the newest proven version "
        "when the step starts; the step records which).",
    )


class Check(BaseModel):
    """A read-only code cell whose declared outputs must satisfy `expect` (a precondition, or a
    write step's status check)."""

    model_config = _STRICT

    name: str = Field("check", max_length=64, description="Shown in errors and in the run's events.")
    run: CodeCell = Field(description="The check's code (read only: it must not change anything).")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments, with references as for a step.")
    expect: dict[str, Any] = Field(description="JSON Schema its outputs must satisfy for the check to hold.")


class Idempotency(BaseModel):
    """How a write step may be repeated after an attempt whose outcome is unknown."""

    model_config = _STRICT

    strategy: Literal["key", "status_read", "compensation", "none"] = Field(
        description="`key`: the step forwards `execbox.idempotency_key()` (stable across attempts) to the "
        "service it writes to, so a retry is safe; `status_read`: `status_check` tells whether the effect "
        "happened (its `expect` holds: applied) before any retry; `none`: never retried once its code may "
        "have run (an unknown outcome is settled by reconcile); `compensation`: as `none`, with a `compensation`."
    )
    status_check: Check | None = Field(None, description="For `status_read`: the check whose `expect` means applied.")
    key: str | None = Field(None, max_length=200, description="A template over the step's arguments, e.g. "
                            "`refund:{args.order_id}` (default `<run>:<step>`): the same write re-added by a revision "
                            "gets the same key; the same key with other arguments is refused.")  # fmt: skip


class Retry(BaseModel):
    model_config = _STRICT

    on: list[TransientCategory] = Field(
        default_factory=lambda: [TransientCategory("sandbox.error")],
        description="Transient categories retried in place (only for steps safe to repeat).",
    )
    max_attempts: int = Field(3, ge=1, le=10, description="Attempts in all, the first included.")
    interval_s: float = Field(1.0, ge=0, le=600, description="Wait before the second attempt; doubles after.")


class Postconditions(BaseModel):
    model_config = _STRICT

    outputs_schema: dict[str, Any] | None = Field(None, description="JSON Schema the step's outputs must satisfy.")
    exit_code: int | None = Field(
        None, ge=0, le=255, description="The exit code the step must end with (0 unless given)."
    )


class Compensation(BaseModel):
    """What undoes a succeeded write (POST .../compensate); its args may refer to its own outputs."""

    model_config = _STRICT

    run: CodeCell = Field(
        description="The code cell that undoes the write; it reads its key as execbox.idempotency_key()."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments, with references as for a step.")
    policy: PolicyRequest | None = Field(None, description="Limits (the step's when omitted).")


class FallbackCategory(enum.StrEnum):
    """The failures a step's fallback may answer: the code's own, its limits, its checks (never an
    unknown outcome, a cancellation or a decision)."""

    CODE_EXIT_NONZERO = "code.exit_nonzero"
    CODE_EXCEPTION = "code.exception"
    CODE_SYNTAX = "code.syntax"
    LIMIT_TIMEOUT = "limit.timeout"
    LIMIT_CPU = "limit.cpu"
    LIMIT_MEMORY = "limit.memory"
    LIMIT_OUTPUT = "limit.output"
    LIMIT_DISK = "limit.disk"
    POLICY_NETWORK_DENIED = "policy.network_denied"
    CHECK_FAILED = "check.failed"
    OUTPUT_INVALID = "output.invalid"
    SANDBOX_ERROR = "sandbox.error"
    EXPIRED = "expired"
    PRECONDITION_FAILED = "precondition.failed"


class Fallback(BaseModel):
    """What the step runs instead when its own run fails with one of `on` (once its retries are
    spent): the same step, so its outputs, dependents and postconditions stay as they are. Never
    for a write whose code started (its effect may have happened)."""

    model_config = _STRICT

    name: str = Field("fallback", max_length=64, description="Shown in the run's events and the hand-off.")
    on: list[FallbackCategory] = Field(min_length=1, max_length=16, description="The categories it answers.")
    run: CodeCell | ScriptRef = Field(description="What runs instead (the step's preconditions do not apply).")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments, with references as for a step.")
    policy: PolicyRequest | None = Field(None, description="Limits (the step's when omitted).")


class StepInput(BaseModel):
    """A value supplied from outside the sandbox (an agent's model call, a person) while the run
    waits: POST /v1/runs/{id}/steps/{step}/input. It becomes the step's outputs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True, serialize_by_alias=True)

    value_schema: dict[str, Any] = Field(
        alias="schema", description="JSON Schema the value (an object: the step's outputs) must satisfy."
    )
    summary: str = Field("", max_length=1000, description="What is asked (the step's `args` are its context).")
    expires_in_s: int = Field(86400, ge=1, le=30 * 86400, description="Unanswered this long: the step fails.")
    by: list[str] = Field(default_factory=list, max_length=32, description="API key ids that may supply it "
                          "(empty: any key of the tenant); others get 403 `input.forbidden`.")  # fmt: skip


class StepSpec(BaseModel):
    model_config = _STRICT

    id: str = Field(pattern=STEP_ID_PATTERN, description="Unique within the run, across all its revisions.")
    # Fields added later are left out of a stored plan while unset, so a process of the previous
    # version (whose steps forbid unknown fields) still reads the runs this one stores.
    run: CodeCell | ScriptRef | None = Field(
        None,
        description="What the step runs: a code cell or a script (give `run` or `input`, not both).",
        exclude_if=_unset,
    )
    input: StepInput | None = Field(
        None,
        description="Instead of `run`: a value supplied from outside while the run waits (`awaiting_input`); "
        "its `args` are the context shown to the supplier.",
        exclude_if=_unset,
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description='Arguments, readable by the code as `execbox.inputs`: JSON values, `{"$ref": "/inputs/x"}`, '
        '`{"$ref": "/steps/<id>/outputs/<name>"}` (keeps the JSON type), or `{"$artifact": '
        '"/steps/<id>/artifacts/<name>"}` (the file is placed under `artifacts/<id>/` and the argument is its path).',
    )
    files: list[InputFile] = Field(
        default_factory=list,
        max_length=64,
        description="Input files, as for an execution (e.g. an uploaded file by id).",
    )
    depends_on: list[str] = Field(default_factory=list, max_length=64, description="Ordering-only dependencies.")
    preconditions: list[Check] = Field(
        default_factory=list,
        max_length=8,
        description="Checked right before each attempt; one that fails: precondition.failed, and the step never runs.",
    )
    postconditions: Postconditions | None = Field(None, description="Checked on the outputs (output.invalid).")
    effect: Literal["read", "write"] | None = Field(
        None,
        description="`write` steps must declare `idempotency`. Omitted: `read` for a step without network; "
        "a possible write (never retried in place once started) for a step with an allowlist.",
    )
    idempotency: Idempotency | None = Field(None, description="Required for `write` steps.")
    approval: Approval | None = Field(None, description="A human or agent decision before the step runs.")
    compensation: Compensation | None = Field(None, description="For a write: what undoes it (POST .../compensate).")
    retry: Retry | None = Field(None, description="In-place retries of transient failures (default: none).")
    fallback: Fallback | None = Field(
        None, description="What runs instead when its run fails with given categories.", exclude_if=_unset
    )
    policy: PolicyRequest = Field(default_factory=PolicyRequest, description="Limits, as for an execution.")

    @model_validator(mode="after")
    def _run_or_input(self) -> StepSpec:
        if (self.run is None) == (self.input is None):
            raise ValueError("give the step either `run` (code or a script) or `input` (a value supplied to it)")
        return self


class Budgets(BaseModel):
    model_config = _STRICT

    max_steps: int = Field(50, ge=1, le=MAX_PLAN_STEPS, description="Step attempts dispatched, at most.")
    max_parallel: int = Field(4, ge=1, le=64, description="Steps queued or running at once.")
    max_replans: int = Field(2, ge=0, le=100, description="Revisions accepted, at most.")
    max_wall_s: float = Field(900.0, gt=0, le=7 * 86400, description="From creation to the end of the run.")
    max_tokens: int | None = Field(None, ge=1, description="Model tokens the agent may report (POST .../usage).")
    max_cost_usd: float | None = Field(None, gt=0, description="Model cost the agent may report.")


class Goal(BaseModel):
    model_config = _STRICT

    step: str = Field(pattern=STEP_ID_PATTERN, description="The step whose outputs decide the goal.")
    outputs_schema: dict[str, Any] = Field(description="JSON Schema the step's outputs must satisfy.")


class PlanDocument(BaseModel):
    model_config = _STRICT

    format: Literal["plan/v1"] = Field(description="`plan/v1`.")
    objective: str = Field("", max_length=4000, description="What the plan is for (shown in the hand-off).")
    inputs: dict[str, Any] = Field(default_factory=dict, description="Run inputs, referred to as `/inputs/...`.")
    budgets: Budgets = Field(default_factory=Budgets, description="Limits of the run.")
    steps: list[StepSpec] = Field(min_length=1, max_length=MAX_PLAN_STEPS, description="The steps.")
    goal: Goal | None = Field(None, description="Final acceptance criteria; unmet: `goal_failed`.")


class RunCreate(BaseModel):
    model_config = _STRICT

    plan: PlanDocument = Field(description="The plan to run.")
    labels: Labels = Field(default_factory=dict, max_length=16, description="Free-form labels (not `execbox.`).")
    webhook: Webhook | None = Field(
        None,
        description="POSTed (signed, retried) on run.needs_replan (with the hand-off), approval.requested, "
        "input.requested and "
        "run.finished; the `Execbox-Event` header names the event.",
    )


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    RUNNING = "running"
    """Dispatched: its execution is queued or running."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UPSTREAM_FAILED = "upstream_failed"
    UNKNOWN_OUTCOME = "unknown_outcome"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"

    @property
    def settled(self) -> bool:
        """Nothing more happens to the step in this revision (unknown_outcome waits for reconcile)."""
        return self in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.UPSTREAM_FAILED,
                        StepStatus.CANCELLED, StepStatus.SUPERSEDED)  # fmt: skip


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    NEEDS_REPLAN = "needs_replan"
    GOAL_FAILED = "goal_failed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def revisable(self) -> bool:
        return self in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_INPUT,
                        RunStatus.NEEDS_REPLAN, RunStatus.GOAL_FAILED)  # fmt: skip


class StepError(BaseModel):
    """Why a step did not succeed: its execution's error, or the run's own reason."""

    category: str = Field(
        description="An execution's category (check.failed, sandbox.error, ...) or the run's: approval.rejected, "
        "approval.expired, input.expired, input.invalid, dependency.failed, cancelled."
    )
    message: str = Field(description="What happened and what to do next.")
    retryable: bool = Field(False, description="Running it again as it is may succeed.")
    details: dict[str, Any] = Field(default_factory=dict, description="Category-specific details.")


class Undo(BaseModel):
    """A step's compensation (`skipped`: none declared, or its outcome is unknown)."""

    status: Literal["pending", "running", "done", "failed", "skipped"] = "pending"
    execution: str | None = Field(None, description="The compensation's execution.")
    reason: str | None = Field(None, description="Why it failed or was skipped.")


class CompensationRun(BaseModel):
    """A run's writes undone one at a time, in reverse dependency order."""

    status: Literal["running", "completed", "stopped"] = Field(description="`stopped`: one failed; see the step.")
    reason: str = Field("", description="Why it was asked for.")
    requested_at: float = Field(description="Unix time.")
    order: list[str] = Field(default_factory=list, description="The succeeded steps, in the order they are undone.")


class InputWait(BaseModel):
    """An input step's request, once asked: what the supplier needs (the step's `args` are its
    context, resolved), until when, and who supplied it."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    summary: str = Field("", description="What is asked.")
    value_schema: dict[str, Any] = Field(alias="schema", description="JSON Schema the value must satisfy.")
    expires_at: float = Field(description="Unix time it expires unanswered (the step fails `input.expired`).")
    by: list[str] = Field(default_factory=list, description="API key ids that may supply it (empty: any).")
    supplied_by: str | None = Field(None, description="Who supplied it (as they said), and with which API key.")
    supplied_at: float | None = Field(None, description="Unix time it was supplied.")


class StepState(BaseModel):
    status: StepStatus = Field(StepStatus.PENDING, description="Where the step is.")
    revision: int = Field(description="The revision that added it.")
    attempts: list[str] = Field(default_factory=list, description="Execution ids of its attempts, in order.")
    outputs: dict[str, Any] | None = Field(None, description="Declared outputs, once it succeeded.")
    error: StepError | None = Field(None, description="Why it did not succeed.")
    side_effects: Literal["none", "possible", "unknown"] | None = Field(
        None, description="For a step that did not succeed: whether its effect may have happened."
    )
    blocked_by: list[str] = Field(default_factory=list, description="Failed or unknown steps it waits behind.")
    approval_id: str | None = Field(None, description="Its approval, when it has one.")
    due_at: float | None = Field(None, description="Unix time the executor looks at it again (a retry, an expiry).")
    args: dict[str, Any] | None = Field(
        None, description="Its resolved arguments, once dispatched or awaiting approval."
    )
    reconciled: str | None = Field(None, description="How an unknown outcome was settled, and why.")
    approval_required: bool = Field(
        False,
        description="A key whose writes need approval (the operator's policy) added it or had it run again: "
        "with side effects, it waits for an approval whether or not the plan asks for one.",
    )
    script: str | None = Field(None, description="For a `script:` step: the `name@version` that ran.")
    checks: list[str] = Field(
        default_factory=list, description="Execution ids of its checks (preconditions, status reads)."
    )
    phase: str | None = Field(
        None, description="While running: `precondition:<n>`, `status_read` or null (the step itself)."
    )
    passed: int = Field(0, description="Preconditions that held before the current attempt.")
    key: str | None = Field(None, description="Its idempotency key, once rendered (its first dispatch).")
    undo: Undo | None = Field(None, description="Its compensation, once the run is compensated.")
    input: InputWait | None = Field(None, description="For an input step, once asked: what is asked and by when.")
    fallback_from: StepError | None = Field(
        None, description="When its fallback ran: the failure of its own run that made it run."
    )
    fallback_at: int | None = Field(None, description="When its fallback ran: the attempt number it began at.")
    may_have_applied: bool = Field(
        False, description="A write: an attempt's code started and no status check said it did not apply."
    )


class RunEvent(BaseModel):
    at: float = Field(description="Unix time.")
    type: str = Field(description="run.created, step.status_changed, run.status_changed, revision.applied, ...")
    step: str | None = Field(None, description="The step concerned, if any.")
    status: str | None = Field(None, description="The status entered, if any.")
    detail: str = Field("", description="Why.")


class RunPublic(BaseModel):
    id: str = Field(description="Run id, `run_` and 26 characters.")
    status: RunStatus = Field(description="Where the run is.")
    stop_reason: str | None = Field(None, description="Why a run stopped: completed, step_failed, budget_exceeded:...")
    revision: int = Field(description="Current revision, 1 for the plan as created.")
    objective: str = Field("", description="The plan's objective.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels from the request.")
    trace_id: str = Field(description="W3C trace id shared by every step's execution.")
    created_at: float = Field(description="Unix time.")
    finished_at: float | None = Field(None, description="Unix time it became terminal.")
    budgets: Budgets = Field(description="Limits.")
    usage: Usage = Field(default_factory=Usage, description="What the run used, with the model calls summed per role.")
    model_calls: list[ModelCall] = Field(
        default_factory=list, description="The model calls the agent reported, in order (the first 1000)."
    )
    steps: dict[str, StepState] = Field(description="Every step of every revision, by id.")
    compensation: CompensationRun | None = Field(None, description="Its compensation, once asked for.")
    events: list[RunEvent] = Field(default_factory=list, description="Every transition, with time and reason.")


class StoredRun(RunPublic):
    """What Redis keeps: the public view plus the plan itself."""

    tenant: str = Field(description="Owner.")
    plan: PlanDocument = Field(description="The plan with every revision's steps (superseded ones included).")
    inputs: dict[str, Any] = Field(default_factory=dict, description="Run inputs.")
    queue: str = Field(description="The queue its steps go to: API processes of that queue advance it.")
    webhook: StoredWebhook | None = Field(None, description="Where its events are POSTed, and the secret.")
    keys: dict[str, str] = Field(default_factory=dict, description="Idempotency keys used -> their arguments' digest.")
    recent_call_ids: list[str] = Field(
        default_factory=list, description="The call_ids of the latest reported model calls (a retried report)."
    )
    _notices: list[dict[str, str]] = PrivateAttr(default_factory=list)
    """Events for its webhook, appended to the outbox when the run is next saved."""

    def notify(self, event: str, **fields: str) -> None:
        if self.webhook is not None:
            self._notices.append({"type": event, "id": self.id, **fields})

    def take_notices(self) -> list[dict[str, str]]:
        notices, self._notices = self._notices, []
        return notices

    def public(self) -> RunPublic:
        return RunPublic.model_validate(self.model_dump(include=set(RunPublic.model_fields)))

    def spec(self, step_id: str) -> StepSpec:
        return next(s for s in self.plan.steps if s.id == step_id)


class RevisionCreate(BaseModel):
    model_config = _STRICT

    base_revision: int = Field(ge=1, description="The revision this one is made against (409 when it moved).")
    reason: str = Field("", max_length=4000, description="Why (recorded).")
    remove: list[str] = Field(default_factory=list, max_length=MAX_PLAN_STEPS, description="Steps to supersede.")
    add: list[StepSpec] = Field(default_factory=list, max_length=MAX_PLAN_STEPS, description="New steps; ids never "
                                "reused; a run holds at most 1000 steps across its revisions.")  # fmt: skip
    goal: Goal | None = Field(None, description="A new goal check, replacing the old one.")


class CompensateRequest(BaseModel):
    model_config = _STRICT

    reason: str = Field(min_length=1, max_length=4000, description="Why the run's writes are undone (recorded).")


class CancelRequest(BaseModel):
    model_config = _STRICT

    compensate: bool = Field(False, description="Undo the writes that succeeded, once it stopped.")
    reason: str = Field("cancelled by the client", min_length=1, max_length=4000, description="Recorded.")


class ReconcileRequest(BaseModel):
    model_config = _STRICT

    outcome: Literal["applied", "not_applied"] = Field(description="Whether the step's effect happened.")
    outputs: dict[str, Any] = Field(default_factory=dict, description="Its outputs when applied.")
    reason: str = Field(min_length=1, max_length=4000, description="Evidence, recorded with the step.")
    retry: bool = Field(False, description="With not_applied: run the step again (same idempotency key).")


MAX_INPUT_BYTES = 64 * 1024
"""Largest input value (as JSON): it is copied into every step that refers to it."""


class InputSupply(BaseModel):
    model_config = _STRICT

    value: dict[str, Any] = Field(
        description="The value: an object, which becomes the step's outputs (at most 64 KiB as JSON, 32 levels deep)."
    )
    supplied_by: str = Field("", max_length=200, description="Who supplies it (informational).")

    @field_validator("value")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        if nesting(value) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if len(json.dumps(value)) > MAX_INPUT_BYTES:
            raise ValueError(f"larger than {MAX_INPUT_BYTES} bytes as JSON; pass large data as a file or an artifact")
        return value


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    """Its subject ended undecided (the run stopped, the execution was cancelled or is gone)."""


class ShownCode(BaseModel):
    """Code that also runs because of an approval: a precondition, a status check, a compensation."""

    role: Literal["precondition", "status_check", "compensation"] = Field(description="Why it runs.")
    name: str = Field("", description="Its name in the plan (a check's), if any.")
    language: str = Field(description="Its language.")
    code: str = Field(description="Its code.")
    args: dict[str, Any] = Field(default_factory=dict, description="Its arguments, references unresolved.")


class ShownFile(BaseModel):
    """An input file the approved code gets."""

    path: str = Field(description="Where the code finds it, under the working directory.")
    size: int | None = Field(None, description="Bytes (null: not known until it runs, e.g. a file gone).")
    sha256: str | None = Field(None, description="SHA-256 of its bytes, hex (null: not known until it runs).")
    source: str = Field(description="`inline`, the uploaded `file_...` id, or the step whose artifact it is.")


class Shown(BaseModel):
    """Everything that runs because of an approval besides the code and its arguments (approvals
    stored before these fields existed read with these defaults, `network` null)."""

    language: str | None = Field(None, description="The code's language.")
    inputs: Any = Field(
        None, description="The code's inputs when they are not an object (a list, a number...); `args` shows an object."
    )
    env_sha256: dict[str, str] = Field(
        default_factory=dict,
        description="Each environment variable's name and the SHA-256 of its value (hex): values are withheld, "
        "since the service cannot tell a secret from a setting, and can be compared with the value meant.",
    )
    stdin_bytes: int = Field(0, description="Size of its standard input.")
    stdin_sha256: str | None = Field(None, description="SHA-256 of its standard input, hex (null: none).")
    files: list[ShownFile] = Field(default_factory=list, description="Its input files, artifacts included.")
    network: Literal["none"] | NetworkAllowlist | None = Field(
        None, description="Its network access: `none` or the allowlist (null: an approval stored before it was shown)."
    )
    policy: str | None = Field(None, description="The named policy it runs under.")
    also_runs: list[ShownCode] = Field(
        default_factory=list,
        description="Code that runs because of this approval too: preconditions, a status check, and the "
        "compensation that undoes it (POST /v1/runs/{id}/compensate).",
    )
    required_by: str | None = Field(
        None, description="Set when the operator's policy asked for it (the submitting key's writes need approval)."
    )


class _ApprovalHead(BaseModel):
    id: str = Field(description="Approval id, `apr_` and 26 characters.")
    run_id: str | None = Field(None, description="The run, for a plan step's approval.")
    step_id: str | None = Field(None, description="The step waiting for it, for a plan step's approval.")
    execution_id: str | None = Field(None, description="The execution waiting for it, for an execution's approval.")
    status: ApprovalStatus = Field(
        description="pending, approved, rejected, expired, or withdrawn (its run or execution ended undecided)."
    )
    summary: str = Field("", description="What is asked.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="The step's resolved arguments (an execution's inputs, when an object)."
    )
    code: str = Field(description="The code that will run (a script's, as registered).")
    requested_at: float = Field(description="Unix time.")
    expires_at: float = Field(description="Unix time it expires unanswered.")
    decided_at: float | None = Field(None, description="Unix time of the decision.")
    decided_by: str | None = Field(None, description="Who decided (as they said), and with which API key.")
    by: list[str] = Field(default_factory=list, description="API key ids that may decide (empty: any of the tenant's).")
    reason: str | None = Field(None, description="The decision's reason, or why it expired or was withdrawn.")
    tenant: str = Field(description="Owner.")


class ApprovalPublic(Shown, _ApprovalHead):
    """What a decider is asked: the code, its arguments, and everything else that runs because of it."""


class Decision(BaseModel):
    model_config = _STRICT

    decision: Literal["approve", "reject"] = Field(description="approve or reject.")
    reason: str = Field("", max_length=4000, description="Recorded with the decision.")
    decided_by: str = Field("", max_length=200, description="Who decides (informational).")
