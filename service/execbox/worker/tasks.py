"""run_execution: the RQ entry point. Parse, start, run in a sandbox, classify, store."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from execbox import logs
from execbox.classify import classify
from execbox.errors import ServiceError
from execbox.models import ErrorCategory, ExecutionError, ExecutionRecord, ExecutionStatus, Resources, Timing
from execbox.sandbox.base import Limits, RunControl, RunOutcome, RunSpec
from execbox.worker.context import WorkerContext, current

log = logging.getLogger(__name__)
_ACTIVE = {ExecutionStatus.RUNNING}


def run_execution(payload: dict[str, Any]) -> str:
    ctx = current()
    execution_id = str(payload["execution_id"])
    with logs.bound(None, execution_id):
        record = _start(ctx, execution_id)
        if record is None:
            return "skipped"
        with logs.bound(record.trace_id, execution_id):
            _run_and_finish(ctx, record)
            return "done"


def _start(ctx: WorkerContext, execution_id: str) -> ExecutionRecord | None:
    """queued → running; None when it expired, was cancelled, or is gone."""
    if ctx.store.expire_if_due(execution_id, ctx.name) is not None:
        log.info("execution expired in the queue")
        return None

    def take(record: ExecutionRecord) -> ExecutionStatus:
        record.started_at = time.time()
        record.worker = ctx.name
        record.attempt += 1
        record.timing.queue_wait_ms = round((record.started_at - record.created_at) * 1000, 1)
        return ExecutionStatus.RUNNING

    ctx.store.renew_lease(execution_id, ctx.name)
    record = ctx.store.transition(execution_id, {ExecutionStatus.QUEUED}, ctx.name, take)
    if record is None:
        log.info("execution not queued any more (cancelled, expired or gone); skipped")
    return record


def _run_and_finish(ctx: WorkerContext, record: ExecutionRecord) -> None:
    control = RunControl()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(ctx, record.id, control, stop), daemon=True)
    watcher.start()
    policy = record.policy
    limits = Limits(
        policy.timeout_s,
        policy.cpu,
        policy.cpu_time_s,
        policy.memory_mb,
        policy.pids,
        policy.disk_mb,
        policy.output_bytes,
    )
    outcome: RunOutcome | None = None
    failure: ExecutionError | None = None
    try:
        language = ctx.languages.get(record.language)
        spec = RunSpec(
            execution_id=record.id,
            trace_id=record.trace_id,
            worker=ctx.name,
            image=language.image,
            command=language.command,
            files=((language.file, record.code.encode()),),
            env=(*language.env, *sorted(record.env.items())),
            limits=limits,
            language=language.name,
        )
        outcome = ctx.runtime.run(spec, control)
    except ServiceError as exc:
        failure = ExecutionError(
            category=ErrorCategory.SANDBOX_ERROR, message=exc.message, retryable=True, details={"code": exc.code}
        )
    except Exception as exc:  # never leave an execution running because of a bug here
        log.exception("sandbox run failed unexpectedly")
        failure = ExecutionError(
            category=ErrorCategory.SANDBOX_ERROR,
            message=f"internal error: {exc!r}; retry",
            retryable=True,
            details={"code": "service.error"},
        )
    finally:
        stop.set()
        ctx.store.signal(record.id, "stop")  # wakes the watcher out of its blocking wait
        watcher.join(timeout=5)
    _finish(ctx, record.id, outcome, failure, limits)


def _finish(
    ctx: WorkerContext, execution_id: str, outcome: RunOutcome | None, failure: ExecutionError | None, limits: Limits
) -> None:
    def apply(record: ExecutionRecord) -> ExecutionStatus:
        now = time.time()
        status = ExecutionStatus.FAILED
        if outcome is not None:
            verdict = classify(outcome, record.language, limits)
            status = verdict.status
            record.error = verdict.error
            record.signal = verdict.signal
            record.exit_code = outcome.exit_code
            record.stdout = outcome.stdout.decode("utf-8", "replace")
            record.stderr = outcome.stderr.decode("utf-8", "replace")
            record.stdout_bytes, record.stderr_bytes = outcome.stdout_total, outcome.stderr_total
            record.stdout_truncated, record.stderr_truncated = outcome.stdout_truncated, outcome.stderr_truncated
            record.image = outcome.image_id
            record.resources = Resources(peak_memory_bytes=outcome.peak_memory_bytes, oom_killed=outcome.oom_killed)
            record.timing = Timing(
                queue_wait_ms=record.timing.queue_wait_ms,
                sandbox_start_ms=round(outcome.start_ms, 1),
                run_ms=round(outcome.run_ms, 1),
            )
        else:
            record.error = failure
        record.timing.total_ms = round((now - record.created_at) * 1000, 1)
        record.finished_at = now
        return status

    done = ctx.store.transition(execution_id, _ACTIVE, ctx.name, apply)
    if done is None:
        log.warning("execution was settled elsewhere (lease lost?) before its result was stored")
    else:
        category = done.error.category.value if done.error else None
        log.info("execution finished", extra={"status": done.status.value, "category": category})


def _watch(ctx: WorkerContext, execution_id: str, control: RunControl, stop: threading.Event) -> None:
    """Renew the lease while the run lasts, and stop the sandbox when a cancel request arrives."""
    interval = max(ctx.settings.worker.lease_s / 3, 0.2)
    while not stop.is_set():
        try:
            ctx.store.renew_lease(execution_id, ctx.name)
            message = ctx.store.wait_signal(execution_id, interval)
            if message == "cancel":
                log.info("cancel requested; stopping the sandbox")
                control.cancel()
                return
            if message == "stop":
                return
        except ServiceError as exc:
            log.warning("lease renewal failed: %s", exc.message)
            stop.wait(interval)
