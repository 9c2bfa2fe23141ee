"""The executions room's errors: an execution that is not there, and an Idempotency-Key used twice. Codes are
listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import FieldProblem, InfrastructureError, NotFound, RequestError


class ExecutionNotFound(NotFound):
    code = "execution.not_found"
    noun = "execution"
    hint = "; it never existed or passed its retention"


class IdempotencyMismatch(RequestError):
    code = "idempotency.mismatch"

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was already used with a different request; use a new key for a new request",
            (FieldProblem("header.Idempotency-Key", "already used with a different body"),),
        )


class IdempotencyInProgress(InfrastructureError):
    code = "idempotency.in_progress"
    http_status = 409

    def __init__(self, key: str) -> None:
        super().__init__(f"the first request with Idempotency-Key {key!r} is still being processed; retry shortly")


__all__ = ["ExecutionNotFound", "IdempotencyInProgress", "IdempotencyMismatch"]
