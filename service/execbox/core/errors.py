"""The service's error taxonomy: faults of the request or of the service, never of user code.

User code that fails, times out or floods its output is a finished execution with an error
category (execbox.core.status.ErrorCategory); only the faults below raise.

    ServiceError                    code, http_status, retryable
    ├── RequestError                4xx, not retryable
    │   ├── InvalidRequest          request.invalid (422)
    │   ├── BodyTooLarge            request.too_large (413)
    │   ├── UnknownLanguage         request.unknown_language (422)
    │   ├── UnknownPolicy           request.unknown_policy (422)
    │   ├── PolicyExceeded          request.policy_exceeded (422)
    │   ├── NotFound                404: `no <noun> <id>; <what to do>`, one subclass per kind:
    │   │     ExecutionNotFound execution.not_found, ArtifactNotFound artifact.not_found,
    │   │     FileNotFound file.not_found, KeyNotFound admin.key_not_found, RunNotFound run.not_found,
    │   │     ScriptNotFound script.not_found, ScheduleNotFound schedule.not_found,
    │   │     SessionNotFound session.not_found, ApprovalNotFound approval.not_found
    │   ├── InvalidKey              auth.invalid_key (401)
    │   ├── PolicyNotAllowed        request.policy_not_allowed (403)
    │   ├── IdempotencyMismatch     idempotency.mismatch (422)
    │   ├── AdminOff                admin.disabled (404)
    │   ├── InvalidPlan             plan.invalid (422, every problem listed)
    │   └── ApprovalForbidden       approval.forbidden (403: another API key must decide)
    ├── ConflictError               execution.finished (409)
    │   ├── RunConflict             run.conflict (409: revision moved, approval decided, step not settleable)
    │   └── SessionEnded            session.ended (409: the session ended; open a new one)
    ├── CapacityError               429/503 with Retry-After, retryable
    │   ├── RateLimited             rate_limited (429)
    │   └── QueueFull               queue_full (503)
    ├── InfrastructureError         5xx, retryable
    │   ├── QueueUnavailable        service.queue_unavailable (503)
    │   ├── RuntimeUnavailable      sandbox.runtime_unavailable (503)
    │   ├── ImageUnavailable        sandbox.image_unavailable (503)
    │   ├── IdempotencyInProgress   idempotency.in_progress (409)
    │   └── RunBusy                 run.busy (503: another request holds the run)
    └── InputUnavailable            sandbox.input_unavailable (500, retryable; a worker's job ends failed)

Every subclass lives in this module: the tree above is the whole taxonomy. Configuration errors
found at start-up (PolicyConfigError, LanguageConfigError, SealingError) are not ServiceErrors:
they stop the process instead of answering a request.
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


class LanguageNotFound(RequestError):
    code = "language.not_found"
    http_status = 404

    def __init__(self, language: str, known: list[str]) -> None:
        super().__init__(f"no language {language!r} here; this service runs {', '.join(known)}")


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


class VariantNotAllowed(RequestError):
    code = "request.variant_not_allowed"

    def __init__(self, language: str, policy: str, allowed: list[str], field: str) -> None:
        allows = ", ".join(allowed) or "none"
        super().__init__(
            f"{language!r} is an image variant policy {policy!r} does not allow (it allows: {allows})",
            (
                FieldProblem(
                    field,
                    f"{language!r} is not allowed under policy {policy!r} (it allows: {allows}); use the language "
                    f"without a variant, another policy, or ask the operator to add it to policies/{policy}.yaml "
                    "`variants`",
                ),
            ),
        )


class NotFound(RequestError):
    """No such item for this tenant (404): one message shape for every kind, `no <noun> <id><hint>`,
    so a new kind names its code, noun and what to do, and nothing else."""

    http_status = 404
    noun = "item"
    hint = ""
    """What to do next, after a semicolon."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"no {self.noun} {item_id}{self.hint}")


class ExecutionNotFound(NotFound):
    code = "execution.not_found"
    noun = "execution"
    hint = "; it never existed or passed its retention"


class ArtifactNotFound(NotFound):
    code = "artifact.not_found"

    def __init__(self, execution_id: str, name: str) -> None:  # two ids: its own message
        RequestError.__init__(self, f"execution {execution_id} has no artifact {name!r} (or it passed its retention)")


class FileNotFound(NotFound):
    code = "file.not_found"
    noun = "file"
    hint = "; it never existed or expired; upload it again"


class InvalidKey(RequestError):
    code = "auth.invalid_key"
    http_status = 401

    def __init__(self, why: str) -> None:
        super().__init__(f"{why}; send `Authorization: Bearer <API key>` (keys: `execbox keys create --tenant T`)")


class PolicyNotAllowed(RequestError):
    code = "request.policy_not_allowed"
    http_status = 403

    def __init__(self, tenant: str, name: str, allowed: list[str]) -> None:
        super().__init__(
            f"tenant {tenant!r} may not use policy {name!r}; allowed: {', '.join(allowed)}",
            (FieldProblem("policy.name", f"one of {', '.join(allowed)}"),),
        )


class IdempotencyMismatch(RequestError):
    code = "idempotency.mismatch"

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was already used with a different request; use a new key for a new request",
            (FieldProblem("header.Idempotency-Key", "already used with a different body"),),
        )


class AdminOff(RequestError):
    code = "admin.disabled"
    http_status = 404

    def __init__(self) -> None:
        super().__init__("admin endpoints are off: set EXECBOX_AUTH__ADMIN_TOKEN, or use `execbox keys`")


class KeyNotFound(NotFound):
    code = "admin.key_not_found"
    noun = "API key"


class InvalidPlan(RequestError):
    code = "plan.invalid"

    def __init__(self, problems: tuple[FieldProblem, ...]) -> None:
        super().__init__(f"the plan has {len(problems)} problem(s); each is listed under `errors`", problems)


class RunNotFound(NotFound):
    code = "run.not_found"
    noun = "run"
    hint = "; it never existed or passed its retention"


class ApprovalNotFound(NotFound):
    code = "approval.not_found"
    noun = "approval"


class ConflictError(ServiceError):
    code = "execution.finished"
    http_status = 409


class ScriptNotFound(NotFound):
    code = "script.not_found"
    noun = "script"
    hint = "; GET /v1/scripts lists this tenant's scripts"


class ScheduleNotFound(NotFound):
    code = "schedule.not_found"
    noun = "schedule"


class SessionNotFound(NotFound):
    code = "session.not_found"
    noun = "session"
    hint = "; GET /v1/sessions lists this tenant's sessions"


class ApprovalForbidden(RequestError):
    code = "approval.forbidden"
    http_status = 403

    def __init__(self, approval_id: str, field: str | None = None) -> None:
        message = f"approval {approval_id} names the API keys that may decide it; this key is not one"
        super().__init__(message, (FieldProblem(field, message),) if field else ())


class RunConflict(ConflictError):
    code = "run.conflict"


class SessionEnded(ConflictError):
    code = "session.ended"


class CapacityError(ServiceError):
    code = "capacity"
    http_status = 429
    retryable = True


class RateLimited(CapacityError):
    code = "rate_limited"
    http_status = 429


class QueueFull(CapacityError):
    code = "queue_full"
    http_status = 503


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


class IdempotencyInProgress(InfrastructureError):
    code = "idempotency.in_progress"
    http_status = 409

    def __init__(self, key: str) -> None:
        super().__init__(f"the first request with Idempotency-Key {key!r} is still being processed; retry shortly")


class InputUnavailable(ServiceError):
    code = "sandbox.input_unavailable"
    retryable = True

    def __init__(self, path: str, file_id: str) -> None:
        super().__init__(f"input file {path} ({file_id}) is no longer stored; upload it again and resubmit")


class RunBusy(InfrastructureError):
    code = "run.busy"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} is being changed by another request; retry shortly")


SANDBOX_FAILURE_REASONS: tuple[str, ...] = (
    ServiceError.code,
    InfrastructureError.code,
    RuntimeUnavailable.code,
    ImageUnavailable.code,
    InputUnavailable.code,
)
"""The codes a run that never got a sandbox fails with (execbox_sandbox_failures_total's reasons)."""
