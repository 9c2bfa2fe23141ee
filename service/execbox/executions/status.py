"""An execution's lifecycle status and its error category: stable enums of the contract.

Their values are part of the API (docs/api.md) and of every stored record: never rename or reuse one.
"""

from __future__ import annotations

import enum


class ExecutionStatus(enum.StrEnum):
    """Lifecycle: queued → running → succeeded | failed | cancelled | expired. Values never change.

    An execution that declares an approval starts `awaiting_approval` (then queued, or failed when
    rejected, or expired); a declared write whose outcome is unknown ends `unknown_outcome`, which
    POST /v1/executions/{id}/reconcile settles as succeeded or failed (execbox.executions.effects)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    AWAITING_APPROVAL = "awaiting_approval"
    UNKNOWN_OUTCOME = "unknown_outcome"
    """Its run ended (slot freed, waiters told); whether its effect happened waits for a reconcile."""

    @property
    def terminal(self) -> bool:
        return self not in (ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.AWAITING_APPROVAL)


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
    OUTCOME_UNKNOWN = "outcome.unknown"
    APPROVAL_REJECTED = "approval.rejected"
    APPROVAL_EXPIRED = "approval.expired"
