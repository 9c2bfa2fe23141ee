"""The service's problem documents (RFC 9457) as exceptions, one class per kind of refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class FieldProblem:
    field: str
    """Where in the request, e.g. `policy.memory_mb` or `files.0.path`."""
    message: str
    """What is wrong with it, and what to do."""


class ExecboxError(Exception):
    """The service refused a request. `code` is its stable machine-readable reason (e.g.
    `request.invalid`), `errors` the fields at fault, `retry_after` the seconds it asked to wait."""

    def __init__(self, status: int, problem: dict[str, Any], retry_after: float | None = None) -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code", ""))
        self.detail = str(problem.get("detail", problem.get("title", "")))
        self.errors = [FieldProblem(str(e.get("field", "")), str(e.get("message", "")))
                       for e in problem.get("errors") or [] if isinstance(e, dict)]  # fmt: skip
        self.retry_after = retry_after
        fields = "; ".join(f"{e.field}: {e.message}" for e in self.errors)
        super().__init__(f"{status} {self.code}: {self.detail}" + (f" ({fields})" if fields else ""))


class InvalidRequest(ExecboxError):
    """400 or 422: the request is wrong; `errors` says where. Not worth retrying unchanged."""


class Unauthorized(ExecboxError):
    """401: no API key, or one the service does not know."""


class Forbidden(ExecboxError):
    """403: the key may not do this."""


class NotFound(ExecboxError):
    """404: no such resource for this tenant."""


class Conflict(ExecboxError):
    """409: the resource's state does not allow it (e.g. cancelling a finished execution)."""


class TooLarge(ExecboxError):
    """413: a body, file or total above its limit."""


class RateLimited(ExecboxError):
    """429: a quota; `retry_after` says when to try again."""


class Unavailable(ExecboxError):
    """503: the service cannot take it now (queue, Redis, no worker); retry later."""


class ServerError(ExecboxError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[ExecboxError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    422: InvalidRequest, 429: RateLimited, 503: Unavailable,
}  # fmt: skip


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (the service sends delta-seconds), if any."""
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def error_for(response: httpx.Response) -> ExecboxError:
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)}
    kind = _BY_STATUS.get(response.status_code, ServerError if response.status_code >= 500 else ExecboxError)
    return kind(response.status_code, problem, retry_after(response))
