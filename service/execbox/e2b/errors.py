"""The E2B room's errors. On the wire they take E2B's shapes (execbox.api.routes.e2b); their codes
are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import ConflictError, InfrastructureError, NotFound, RequestError, ServiceError


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


class TooManyContexts(ConflictError):
    code = "e2b.too_many_contexts"

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"this sandbox has {cap} code contexts of its own already: remove one (DELETE /contexts/{{id}})"
        )


class ContextCellFailed(InfrastructureError):
    """The cell that moves a context to its directory or resets it did not succeed."""

    code = "e2b.context_cell_failed"
    http_status = 500
    retryable = False


class SandboxBusy(InfrastructureError):
    """A cell of the facade's own (a context's reset or move) still waits behind the sandbox's
    other cells: it will run; the call may be repeated."""

    code = "e2b.sandbox_busy"
    http_status = 503
    retryable = True


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


class PathNotFound(RequestError):
    """A file call's path, or a process, that is not there (the sandbox's own words)."""

    code = "e2b.not_found"
    http_status = 404


class FileExists(ConflictError):
    code = "e2b.exists"
    http_status = 409


class FileTooLarge(RequestError):
    """A file larger than the facade moves (EXECBOX_E2B__MAX_FILE_BYTES), or a full workspace."""

    code = "e2b.too_large"
    http_status = 413


class PathRefused(RequestError):
    """A path the sandbox will not take: outside the workspace for a change, in /proc, /sys or /dev,
    through a link it does not follow, not a regular file."""

    code = "e2b.path_refused"
    http_status = 400


class EnvdFailed(InfrastructureError):
    """A file or process call that failed in the sandbox for a reason of its own."""

    code = "e2b.call_failed"
    http_status = 500
    retryable = False


class EnvdTimeout(InfrastructureError):
    code = "e2b.call_timeout"
    http_status = 504


__all__ = [
    "BadAccessToken",
    "ContextCellFailed",
    "ContextNotFound",
    "EnvdFailed",
    "EnvdTimeout",
    "FileExists",
    "FileTooLarge",
    "NotOffered",
    "PathNotFound",
    "PathRefused",
    "SandboxBusy",
    "SandboxGone",
    "SandboxNotFound",
    "TooManyContexts",
]
