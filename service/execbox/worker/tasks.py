"""run_next: the RQ entry point (`execbox.executions.queue.TASK`). It takes the next execution,
fair across tenants, and hands it to the lifecycle (execbox.executions.lifecycle), which decides
and stores everything else."""

from __future__ import annotations

import logging
from secrets import token_hex
from typing import Any

from execbox.core import logs
from execbox.core.errors import ServiceError
from execbox.core.tracing import TraceContext, parse_traceparent
from execbox.executions.lifecycle import run_and_finish, take
from execbox.executions.queue import take_next, taken
from execbox.worker.context import current

log = logging.getLogger(__name__)


def run_next(_: dict[str, Any]) -> str:
    """A dispatch ticket: run the next execution that can start; skip cancelled or expired ones."""
    ctx = current()
    while (entry := take_next(ctx.store.redis, ctx.settings)) is not None:
        # Not reset on return: RQ's own lines about this job ("Job OK") then name the execution
        # too; the worker's per-job scope ends the binding.
        logs.bind(None, entry.execution_id)
        record = take(ctx, entry.execution_id)
        try:
            taken(ctx.store.redis, ctx.settings, entry)
        except ServiceError as exc:  # the run goes on: the reaper drops the entry, finding it not queued
            log.warning("could not drop the taken entry: %s", exc.message)
        if record is None:
            continue
        logs.bind(record.trace_id, entry.execution_id)
        parent = parse_traceparent(entry.traceparent) or TraceContext(record.trace_id, token_hex(8))
        run_and_finish(ctx, record, parent)
        return entry.execution_id
    logs.bind(None, None)
    return "nothing to run"
