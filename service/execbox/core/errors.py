"""The error mechanism: the bases every room's errors derive from, and the few no one room owns.

User code that fails, times out or floods its output is a finished execution with an error
category (execbox.executions.status.ErrorCategory); only faults of the request or of the service raise,
as a `ServiceError` with a `code` (dotted, stable: clients match on it), an `http_status` and
whether a retry may help. The API renders any of them as a problem document (execbox.api.problems).

    ServiceError                    code, http_status, retryable
    ├── RequestError                4xx, not retryable
    │   ├── InvalidRequest          request.invalid (422)
    │   ├── BodyTooLarge            request.too_large (413)
    │   └── NotFound                404: `no <noun> <id><hint>`; each room has its kinds
    ├── ConflictError               execution.finished (409); the rooms' conflicts derive from it
    ├── CapacityError               429/503 with Retry-After, retryable
    └── InfrastructureError         5xx, retryable
        └── QueueUnavailable        service.queue_unavailable (503: Redis, the seam in execbox.core.redis)

Each room defines its own errors in its `errors.py`, subclassing these; docs/architecture.md draws
the whole tree, generated from the classes (execbox.vocabulary). Configuration errors found at
start-up (PolicyConfigError, LanguageConfigError, SealingError) are not ServiceErrors: they stop
the process instead of answering a request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldProblem:
    """One invalid field: a dotted path into the request and what to do about it."""

    field: str
    message: str


class ServiceError(Exception):
    code = "service.error"
    http_status = 500
    retryable = False

    def __init__(
        self, message: str, problems: tuple[FieldProblem, ...] = (), headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.problems = problems
        self.headers = headers or {}


class RequestError(ServiceError):
    code = "request.invalid"
    http_status = 422


class InvalidRequest(RequestError):
    pass


class BodyTooLarge(RequestError):
    code = "request.too_large"
    http_status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body exceeds {limit} bytes; send less, or upload files separately")


class NotFound(RequestError):
    """No such item for this tenant (404): one message shape for every kind, `no <noun> <id><hint>`,
    so a new kind names its code, noun and what to do, and nothing else."""

    http_status = 404
    noun = "item"
    hint = ""
    """What to do next, after a semicolon."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"no {self.noun} {item_id}{self.hint}")


class ConflictError(ServiceError):
    code = "execution.finished"
    http_status = 409


class CapacityError(ServiceError):
    code = "capacity"
    http_status = 429
    retryable = True


class InfrastructureError(ServiceError):
    code = "service.unavailable"
    http_status = 503
    retryable = True


class QueueUnavailable(InfrastructureError):
    code = "service.queue_unavailable"


__all__ = [
    "BodyTooLarge",
    "CapacityError",
    "ConflictError",
    "FieldProblem",
    "InfrastructureError",
    "InvalidRequest",
    "NotFound",
    "QueueUnavailable",
    "RequestError",
    "ServiceError",
]
