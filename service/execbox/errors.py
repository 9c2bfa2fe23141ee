"""The service's error taxonomy: faults of the request or of the service, never of user code.

User code that fails, times out or floods its output is a finished execution with an error
category (models.ErrorCategory); only the faults below raise.

    ServiceError                    code, http_status, retryable
    ├── RequestError                4xx, not retryable
    │   ├── InvalidRequest          request.invalid (422)
    │   ├── BodyTooLarge            request.too_large (413)
    │   ├── UnknownLanguage         request.unknown_language (422)
    │   ├── UnknownPolicy           request.unknown_policy (422)
    │   ├── PolicyExceeded          request.policy_exceeded (422)
    │   └── ExecutionNotFound       execution.not_found (404)
    ├── ConflictError               execution.finished (409)
    ├── CapacityError               429/503 with Retry-After, retryable (quotas: rate_limited, queue_full)
    └── InfrastructureError         5xx, retryable
        ├── QueueUnavailable        service.queue_unavailable (503)
        ├── RuntimeUnavailable      sandbox.runtime_unavailable (503)
        └── ImageUnavailable        sandbox.image_unavailable (503)
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


class UnknownLanguage(RequestError):
    code = "request.unknown_language"

    def __init__(self, language: str, known: list[str]) -> None:
        super().__init__(
            f"unknown language {language!r}; use one of {', '.join(known)} (GET /v1/languages)",
            (FieldProblem("language", f"must be one of {', '.join(known)}"),),
        )


class UnknownPolicy(RequestError):
    code = "request.unknown_policy"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"unknown policy {name!r}; use one of {', '.join(known)}",
            (FieldProblem("policy.name", f"must be one of {', '.join(known)}"),),
        )


class PolicyExceeded(RequestError):
    code = "request.policy_exceeded"

    def __init__(self, problems: tuple[FieldProblem, ...]) -> None:
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems), problems)


class ExecutionNotFound(RequestError):
    code = "execution.not_found"
    http_status = 404

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"no execution {execution_id}; it never existed or passed its retention")


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


class RuntimeUnavailable(InfrastructureError):
    code = "sandbox.runtime_unavailable"


class ImageUnavailable(InfrastructureError):
    code = "sandbox.image_unavailable"
