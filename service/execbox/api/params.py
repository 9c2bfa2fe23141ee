"""HTTP parameters several routes share: waiting (`?wait=`, `Prefer: wait=`), trace context, and
noticing a client that went away while it waited."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Header, Query, Request

from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.settings import Settings

_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)

WaitQuery = Annotated[
    float | None,
    Query(
        ge=0,
        description="Seconds to wait for the execution to finish "
        "before answering (bounded by the server's max_wait_s).",
    ),
]
PreferHeader = Annotated[str | None, Header(description="RFC 7240 `wait=SECONDS`, like ?wait=.")]
TraceHeader = Annotated[str | None, Header(description="W3C trace context; a new trace starts without it.")]
IdempotencyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retries with the same key (per tenant and route) and the same body return what the first "
        "request created (with `Idempotent-Replayed: true`); another body under the key is a 422 "
        "`idempotency.mismatch`, a first request still in progress a 409 `idempotency.in_progress`.",
    ),
]
"""One declaration for every route that creates under an Idempotency-Key (executions, files, runs,
script invocations)."""


def wait_seconds(settings: Settings, query: float | None, prefer: str | None) -> float:
    field, value = "query.wait", query
    if value is None and prefer:
        match = _PREFER_WAIT.search(prefer)
        field, value = "header.Prefer", float(match.group(1)) if match else None
    if value is None:
        return 0.0
    limit = settings.api.max_wait_s
    if value > limit:
        raise InvalidRequest(
            f"{field}: {value:g} s is above the server's limit of {limit:g} s",
            (FieldProblem(field, f"at most {limit:g}; poll GET /v1/executions/{{id}} after that"),),
        )
    return value


def disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """Returns when the client has gone (the body is read by now, so the next message is that)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return gone
