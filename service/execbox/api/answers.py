"""How a route answers with an execution, the same for every route that queues one (POST
/v1/executions, POST /v1/scripts/{name}/invoke) and every route that reads one: the status (200
once it ended, 202 before), `Location`, `X-Trace-Id` and `traceparent`; for a submission also its
admission's `RateLimit-*` and, on an Idempotency-Key replay, `Idempotent-Replayed: true`."""

from __future__ import annotations

from fastapi import Request, Response

from execbox.api.params import disconnected
from execbox.core.tracing import TraceContext
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionPublic
from execbox.executions.submit import Submission
from execbox.executions.waits import Waiters


def execution(
    response: Response, record: ExecutionRecord, trace: TraceContext, status: int | None = None
) -> ExecutionPublic:
    """The record as the answer; `trace` is the request's (its span goes into `traceparent`)."""
    response.status_code = status or (200 if record.status.terminal else 202)
    response.headers["Location"] = f"/v1/executions/{record.id}"
    response.headers["X-Trace-Id"] = record.trace_id
    response.headers["traceparent"] = TraceContext(record.trace_id, trace.span_id, trace.flags).traceparent
    return record.public()


async def submitted(
    request: Request, response: Response, waiters: Waiters, submission: Submission, wait_s: float
) -> ExecutionPublic:
    """A submission's answer: its execution as it is after waiting up to `wait_s` for its end (less
    if the client goes away)."""
    if submission.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers.update(submission.headers)
    record = submission.record
    if wait_s > 0:
        record = await waiters.wait(record.id, wait_s, disconnected(request)) or record
    return execution(response, record, submission.trace)
