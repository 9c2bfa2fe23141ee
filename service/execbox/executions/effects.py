"""Side effects of one execution: what a caller declares about them, and what the service does with
an attempt whose outcome is unknown.

An execution may declare its `effect` (`read`: safe to run again; `write`: it changes the world),
for a write how it may be repeated (`idempotency`), and an `approval` before it runs: the same
vocabulary as a plan's step (execbox.plans reuses these models). An attempt's outcome is unknown
when its worker was lost after the code started, or when the code itself said so
(`execbox.outcome_unknown(reason)`, the `outcome.unknown` category). What follows is `next_step`:

- undeclared (`effect` omitted): as before effects existed, the execution fails and the caller
  decides (`sandbox.error`, retryable; or `outcome.unknown`);
- `read`, or a `write` with a `key`: it runs again in place (same execution, same key), at most
  `MAX_ATTEMPTS` times in all;
- a `write` with `status_read`: its status check runs first (a phase of the same execution); the
  check says applied (succeeded, with the check's outputs), not applied (run again with the same
  key), or cannot tell (`unknown_outcome`);
- a `write` with `none`: `unknown_outcome`, until POST /v1/executions/{id}/reconcile settles it.

A session call never runs again in place (the session's state may have moved, or the session is
gone): a keyed one fails, retryable with its key; an unkeyed one ends `unknown_outcome`.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.schemacheck import schema_errors

MAX_ATTEMPTS = 3
"""Times a declared execution's code may start in all, the first included."""
MAX_TAKES = 2 * MAX_ATTEMPTS
"""Times a worker may take it in all, status checks included (checks whose workers keep being lost
end it `unknown_outcome`)."""
KEY_PATTERN = r"^[!-~]{1,200}$"
"""An idempotency key: 1-200 printable ASCII characters, no spaces."""
_STRICT = ConfigDict(extra="forbid")


class Approval(BaseModel):
    """A decision a person (or an agent) makes before the code runs."""

    model_config = _STRICT

    required: bool = Field(True, description="Wait for a decision before running.")
    summary: str = Field("", max_length=1000, description="What the approver is asked to allow.")
    expires_in_s: int = Field(86400, ge=1, le=30 * 86400, description="Unanswered this long: expired (rejected).")
    by: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="API key ids (`execbox keys list`) that may decide; "
        "empty: any key of the tenant. Others get 403 `approval.forbidden`.",
    )


class StatusCheck(BaseModel):
    """Read-only code that tells whether an execution's effect happened: its declared outputs
    satisfy `expect` when it did. It gets the execution's inputs, files and idempotency key."""

    model_config = _STRICT

    name: str = Field("status", max_length=64, description="Shown in the execution's record.")
    code: str = Field(min_length=1, description="The check's code (it must not change anything).")
    language: str = Field("python", min_length=1, max_length=64, description="Its language (GET /v1/languages).")
    expect: dict[str, Any] = Field(description="JSON Schema its outputs satisfy when the effect happened.")


class EffectIdempotency(BaseModel):
    """How a write execution may be repeated after an attempt whose outcome is unknown."""

    model_config = _STRICT

    strategy: Literal["key", "status_read", "none"] = Field(
        description="`key`: the code forwards `execbox.idempotency_key()` to the service it writes to, so a "
        "retry is safe; `status_read`: `status_check` tells whether the effect happened before any retry; "
        "`none`: never repeated once the code may have run (an unknown outcome waits for reconcile)."
    )
    key: str | None = Field(
        None,
        pattern=KEY_PATTERN,
        description="The stable key of this logical call (the request's Idempotency-Key when omitted); the "
        "code reads it as `execbox.idempotency_key()` on every attempt.",
    )
    status_check: StatusCheck | None = Field(None, description="For `status_read`: the check.")


class EffectDeclaration(BaseModel):
    """What a request declares about its effect (ExecutionCreate's part)."""

    model_config = _STRICT

    effect: Literal["read", "write"] | None = Field(
        None,
        description="What the code does to the world: `read` (safe to run again: a lost worker's attempt is "
        "run again in place) or `write` (give `idempotency`). Omitted: undeclared, as before (a lost "
        "worker's attempt fails, `sandbox.error`, and the caller decides).",
    )
    idempotency: EffectIdempotency | None = Field(
        None, description="For `effect: write`: how it may be repeated after an attempt whose outcome is unknown."
    )
    approval: Approval | None = Field(
        None,
        description="Wait (`awaiting_approval`, listed in GET /v1/approvals) for a decision before running; "
        "a rejection or an expiry ends it without running.",
    )

    @model_validator(mode="after")
    def _declared_whole(self) -> EffectDeclaration:
        if self.effect == "write" and self.idempotency is None:
            raise ValueError("idempotency: a write must say how it may be repeated (key, status_read or none)")
        if self.idempotency is not None and self.effect != "write":
            raise ValueError("idempotency is for a write: give `effect: write` too")
        if self.idempotency is not None and (self.idempotency.strategy == "status_read") != (
            self.idempotency.status_check is not None
        ):
            raise ValueError("idempotency.status_check: give it with strategy status_read, and only then")
        if (
            self.idempotency is not None
            and self.idempotency.strategy == "status_read"
            and getattr(self, "session", None) is not None
        ):
            raise ValueError("idempotency.strategy: status_read is for executions outside sessions; use key or none")
        return self


class EffectState(BaseModel):
    """What an execution shows of its effect (ExecutionPublic's part)."""

    effect: Literal["read", "write"] | None = Field(None, description="Its declared effect (null: undeclared).")
    idempotency: EffectIdempotency | None = Field(None, description="How a write may be repeated, as declared.")
    approval_id: str | None = Field(None, description="Its approval (GET /v1/approvals/{id}), when it has one.")
    code_runs: int = Field(0, description="Times its code started (a status check's run is not counted).")
    phase: Literal["status_read"] | None = Field(
        None, description="`status_read` while its status check is queued or running (its code is not)."
    )
    side_effects: Literal["none", "possible", "unknown"] | None = Field(
        None, description="For a declared write that did not succeed: whether its effect may have happened."
    )
    reconciled: str | None = Field(None, description="How an unknown outcome was settled, and why.")


class ExecutionReconcile(BaseModel):
    """The caller's evidence for an execution that ended `unknown_outcome`."""

    model_config = _STRICT

    outcome: Literal["applied", "not_applied"] = Field(description="Whether its effect happened.")
    outputs: dict[str, Any] = Field(default_factory=dict, description="Its outputs, when applied.")
    reason: str = Field(min_length=1, max_length=4000, description="The evidence, recorded with it.")


class Next(enum.StrEnum):
    """What follows an attempt whose outcome is unknown."""

    FAIL = "fail"
    """End it failed (undeclared, or out of attempts)."""
    RETRY = "retry"
    STATUS_READ = "status_read"
    UNKNOWN = "unknown_outcome"


def next_step(effect: str | None, strategy: str | None, attempts: int, in_session: bool) -> Next:
    """What follows an attempt of a declared execution whose outcome is unknown, after `attempts`
    runs of its code (see the module's doc)."""
    if effect is None:
        return Next.FAIL
    if effect == "read" or strategy == "key":
        return Next.RETRY if attempts < MAX_ATTEMPTS and not in_session else Next.FAIL
    if strategy == "status_read" and not in_session:
        return Next.STATUS_READ
    return Next.UNKNOWN


def holds(expect: dict[str, Any], outputs: dict[str, Any]) -> bool | None:
    """A check's outputs satisfy its `expect` schema; None when the schema cannot judge them (it is
    checked at submission; a record stored before that check may hold one that raises)."""
    try:
        return not schema_errors(expect, outputs)
    except Exception:
        return None


def call_context(
    idempotency: EffectIdempotency | None, context: dict[str, str] | None, request_key: str | None
) -> dict[str, str]:
    """What the program is told: a submitter's context, and the call's idempotency key (the declared
    one, else the request's Idempotency-Key) unless the submitter gave its own (a plan step's)."""
    found = dict(context or {})
    key = (idempotency.key if idempotency else None) or request_key
    if idempotency is not None and idempotency.strategy == "key" and key is None:
        raise InvalidRequest(
            "a keyed write needs its key: give idempotency.key or an Idempotency-Key header",
            (FieldProblem("idempotency.key", "give a stable key for this logical call"),),
        )
    if key is not None:
        found.setdefault("idempotency_key", key)
    return found


REQUIRED_BY = "the operator's policy: the submitting API key's writes need approval"
"""What an approval the submitter did not ask for says required it."""


def gate(
    approval: Approval | None, effect: str | None, has_network: bool, approval_required: bool, offered: bool
) -> tuple[Approval | None, str | None]:
    """The approval an execution waits for (None: it runs at once), and who required it when the
    submitter did not ask: the operator's policy, for a key whose writes need approval
    (`approval_required`), on anything with side effects (a write, or network access)."""
    if approval is not None and approval.required:
        return approval, None
    if not approval_required or (effect != "write" and not has_network):
        return None, None
    if not offered:
        problem = FieldProblem("approval", "required for this API key's writes, and not offered to this submitter")
        raise InvalidRequest(f"approval: {problem.message}", (problem,))
    expires = approval.expires_in_s if approval is not None else Approval().expires_in_s
    return Approval(summary=approval.summary if approval is not None else "", expires_in_s=expires), REQUIRED_BY


def effect_problems(
    effect: str | None, approval: Approval | None, has_network: bool, must_declare: bool, gated: bool
) -> list[FieldProblem]:
    """What a tenant's rule (`declare_effects`) and the submitter refuse in an execution's declarations."""
    found = []
    if must_declare and has_network and effect is None:
        found.append(FieldProblem("effect", "this tenant requires executions with network access to declare "
                                            "their effect: read, or write with idempotency"))  # fmt: skip
    if approval is not None and not gated:
        found.append(FieldProblem("approval", "approvals are not offered to this submitter"))
    return found
