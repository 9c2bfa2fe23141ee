"""The tenancy room's errors: API keys, the admin switch, the policies a tenant may use, quotas. Codes are
listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

import time

from execbox.core.errors import CapacityError, FieldProblem, NotFound, RequestError


class InvalidKey(RequestError):
    code = "auth.invalid_key"
    http_status = 401

    def __init__(self, why: str) -> None:
        super().__init__(f"{why}; send `Authorization: Bearer <API key>` (keys: `execbox keys create --tenant T`)")


class NotAdmin(RequestError):
    code = "auth.not_admin"
    http_status = 403

    def __init__(self) -> None:
        super().__init__(
            "this is a tenant's API key: admin routes take the operator's admin token "
            "(`Authorization: Bearer <EXECBOX_AUTH__ADMIN_TOKEN>`)"
        )


class UngatedRoute(RequestError):
    """A key whose writes need approval (KeyInfo.require_approval) called a route that runs code with no
    approval on the way (a script's invocation, a schedule, an E2B sandbox): the gate cannot be left out."""

    code = "approval.forbidden"
    http_status = 403

    def __init__(self, what: str) -> None:
        super().__init__(
            f"this API key's writes need approval (the operator's policy), and {what} runs code with no approval on "
            "the way: submit it as an execution or a run step (POST /v1/executions, /v1/runs), which wait for one"
        )


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


class StorageBudgetFull(RateLimited):
    """What the tenant keeps in the shared Redis would pass its storage budget (tenants.yaml `storage_budget_mb`):
    `rate_limited`, the problem naming the budget (`tenant.storage_budget`) with its use, size and next room."""

    def __init__(self, tenant: str, used: int, budget: int, wanted: int, room_at: float, what: str) -> None:
        wait = max(int(room_at - time.time()), 1) if room_at else 1
        if wanted > budget:
            advice = "it can never fit: send less, lower the policy's output_bytes, or ask for a larger budget"
        else:
            advice = f"room comes back as kept data expires, the first in {wait} s; retry then, or raise the budget"
        super().__init__(
            f"tenant {tenant!r} keeps {used} bytes in the shared store, of its storage budget {budget} "
            f"(tenant.storage_budget, tenants.yaml storage_budget_mb); {what} needs {wanted} more; {advice}",
            (FieldProblem("tenant.storage_budget", f"{used} of {budget} bytes used; {wanted} more needed"),),
            headers={"Retry-After": str(wait), "Execbox-Storage-Used": str(used),
                     "Execbox-Storage-Budget": str(budget)},
        )  # fmt: skip
        self.used, self.budget, self.wanted, self.room_at = used, budget, wanted, room_at
        self.retryable = wanted <= budget  # waiting cannot make room for more than the whole budget


class SignInThrottled(RateLimited):
    """Too many failed console sign-ins from this source, or admin-token tries from anywhere, in a window."""

    def __init__(self, retry_after_s: int, whose: str) -> None:
        super().__init__(
            f"too many failed sign-ins {whose}; try again in {retry_after_s} s (or use the CLI with the admin token)",
            headers={"Retry-After": str(retry_after_s)},
        )
        self.retry_after_s = retry_after_s


class QueueFull(CapacityError):
    code = "queue_full"
    http_status = 503


__all__ = [
    "AdminOff",
    "InvalidKey",
    "KeyNotFound",
    "NotAdmin",
    "PolicyNotAllowed",
    "QueueFull",
    "RateLimited",
    "SignInThrottled",
    "StorageBudgetFull",
    "UngatedRoute",
]
