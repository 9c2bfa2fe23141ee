"""The tenancy room's errors: API keys, the admin switch, the policies a tenant may use, quotas. Codes are
listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import CapacityError, FieldProblem, NotFound, RequestError


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


class AdminOff(RequestError):
    code = "admin.disabled"
    http_status = 404

    def __init__(self) -> None:
        super().__init__("admin endpoints are off: set EXECBOX_AUTH__ADMIN_TOKEN, or use `execbox keys`")


class KeyNotFound(NotFound):
    code = "admin.key_not_found"
    noun = "API key"


class RateLimited(CapacityError):
    code = "rate_limited"
    http_status = 429


class QueueFull(CapacityError):
    code = "queue_full"
    http_status = 503


__all__ = ["AdminOff", "InvalidKey", "KeyNotFound", "PolicyNotAllowed", "QueueFull", "RateLimited"]
