"""The E2B room's errors. On the wire they take E2B's shapes (execbox.api.routes.e2b); their codes
are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import NotFound, RequestError, ServiceError


class SandboxNotFound(NotFound):
    code = "e2b.sandbox_not_found"
    noun = "sandbox"
    hint = "; it ended, or it is another tenant's"


class BadAccessToken(RequestError):
    code = "e2b.access_token"
    http_status = 401

    def __init__(self) -> None:
        super().__init__("the access token does not open this sandbox: use the envdAccessToken create or connect gave")


class ContextNotFound(NotFound):
    code = "e2b.context_not_found"
    noun = "code context"
    hint = "; GET /contexts lists this sandbox's"


class NotOffered(ServiceError):
    """A part of E2B's API this server does not offer (yet): refused at once, never left to hang."""

    code = "e2b.not_offered"
    http_status = 501


class SandboxGone(ServiceError):
    """An in-sandbox call to a sandbox that ended: E2B's SDK reads 502 and "was not found" as
    "not running" (is_running() is False, a call raises SandboxNotRunningException)."""

    code = "e2b.sandbox_gone"
    http_status = 502

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"The sandbox {sandbox_id} was not found: it ended (killed, timed out or lost)")


__all__ = ["BadAccessToken", "ContextNotFound", "NotOffered", "SandboxGone", "SandboxNotFound"]
