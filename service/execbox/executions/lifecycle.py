"""An execution's life after it was accepted, top to bottom: taken → running → outcome → stored →
announced (accepted is `executions.submit`).

- taken (`take`): queued → running with the run's lease, in one compare-and-set;
- running (`run_and_finish`): the sandbox runs the spec (`_spec`) while a watcher renews the lease
  and passes a cancel on; live output goes to the execution's stream as it comes;
- outcome: the program's files are read (`executions.outputs`, which writes the blobs of large
  outputs now, before any transaction), then `executions.outcome.decide` makes the result a value;
- stored (`_store`): the terminal transition applies that value to the record (a pure change that
  a WATCH/MULTI retry may run again), frees the tenant's quota slot and drops the lease;
- announced: the same transaction appends the outbox event (webhooks, plans) and publishes the
  done channel (waiting requests); the process's listeners (outcome metrics) hear of it after
  the commit (`executions.events`);
- lost (`settle_lost`): a running execution whose worker stopped renewing its lease is settled as
  its declared effect calls for (failed, `unknown_outcome`, or queued again and its entry queued);
  the reaper (`execbox.worker.reaper`) finds them, this decides.

A session's call goes the same way: only where it runs differs (`session.run_cell` in a kept
kernel instead of `SandboxRunner.run` in a fresh container); `execbox.sessions.host` holds the session.
The worker (`execbox.worker`) only feeds this module tickets. The API never imports it: it is the
one module of the room that reaches the sandbox.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Protocol

from execbox.catalog.languages import Languages
from execbox.catalog.schemas import AppliedPolicy, NetworkAllowlist
from execbox.core.errors import QueueUnavailable, ServiceError
from execbox.core.redis import through_outage
from execbox.core.tracing import Spans, TraceContext
from execbox.egress.rules import EgressRule
from execbox.egress.store import EgressStore, RunEgress
from execbox.executions.effects import StatusCheck
from execbox.executions.inputs import INPUTS_FILE
from execbox.executions.live import LiveOutput
from execbox.executions.metrics import WorkerMetrics
from execbox.executions.outcome import Outcome, decide
from execbox.executions.outputs import read_files
from execbox.executions.queue import requeue
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError
from execbox.executions.settings import ExecutionsConfig
from execbox.executions.settle import after_run, checking, mark_expired_if_due
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.files.archive import input_archive
from execbox.files.blobs import ArtifactStore
from execbox.files.collect import RESULT_FILE, ArtifactCaps, Collector
from execbox.files.store import FileStore
from execbox.sandbox.pool import WarmPool
from execbox.sandbox.runtime import (
    WORKDIR,
    EgressSpec,
    Limits,
    SandboxControl,
    SandboxOutcome,
    SandboxRunner,
    SandboxSpec,
    SessionSandbox,
)

log = logging.getLogger(__name__)
_ACTIVE = {ExecutionStatus.RUNNING}


class Worker(Protocol):
    """What the lifecycle needs of the process running it (execbox.worker.context.WorkerContext)."""

    @property
    def settings(self) -> ExecutionsConfig: ...
    @property
    def name(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def store(self) -> ExecutionStore: ...
    @property
    def files(self) -> FileStore: ...
    @property
    def egress(self) -> EgressStore: ...
    @property
    def artifacts(self) -> ArtifactStore: ...
    @property
    def languages(self) -> Languages: ...
    @property
    def runtime(self) -> SandboxRunner: ...
    @property
    def pool(self) -> WarmPool | None: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def spans(self) -> Spans: ...
    @property
    def backstop_s(self) -> int: ...


# -- taken ------------------------------------------------------------------------------------


def take(ctx: Worker, execution_id: str) -> ExecutionRecord | None:
    """queued → running, with the run's lease, in one transaction; None when it expired, was
    cancelled, or is gone."""

    def started(record: ExecutionRecord) -> ExecutionStatus | None:
        if mark_expired_if_due(record) is not None:
            return ExecutionStatus.EXPIRED
        record.started_at = time.time()
        record.worker = ctx.name
        record.node = ctx.node
        record.policy.runtime = record.policy.runtime or ctx.settings.docker.runtime or "runc"
        record.attempt += 1
        if record.phase is None:  # a status check's run is not the code's
            record.code_runs += 1
        record.timing.queue_wait_ms = round((record.started_at - record.created_at) * 1000, 1)
        return ExecutionStatus.RUNNING

    record = ctx.store.transition(execution_id, {ExecutionStatus.QUEUED}, ctx.name, started, lease=True)
    if record is None:
        log.info("execution not queued any more (cancelled or gone); skipped")
    elif record.status is ExecutionStatus.EXPIRED:
        log.info("execution expired in the queue")
        return None
    return record


# -- running, outcome, stored -------------------------------------------------------------------


def run_and_finish(
    ctx: Worker,
    record: ExecutionRecord,
    parent: TraceContext,
    session: SessionSandbox | None = None,
    control: SandboxControl | None = None,
    before_store: Callable[[SandboxOutcome | None], None] | None = None,
) -> None:
    """Run a taken execution (in a fresh sandbox, or as a call in `session`) and store its outcome;
    `before_store` is told the sandbox's outcome first."""
    control = control or SandboxControl()
    check = record.idempotency.status_check if record.phase == "status_read" and record.idempotency else None
    if check is not None:  # this take runs the status check, not the code (execbox.executions.effects)
        record = checking(record, check)
    limits = run_limits(record.policy)
    collector = Collector(
        record.id,
        ctx.artifacts,
        ArtifactCaps(record.policy.artifact_file_bytes, record.policy.artifact_total_bytes,
                     record.policy.artifact_files),
        root="workspace" if record.outputs_spec.files else "out",
        globs=tuple(record.outputs_spec.files),
    )  # fmt: skip
    run, failure = _run(ctx, record, limits, collector, session, control)
    _trace_run(ctx, record, run, parent)
    patience_s = ctx.settings.worker.lease_s * 3
    denials = (
        through_outage("reading the run's egress denials", lambda: ctx.egress.denials(record.id), patience_s)
        if isinstance(record.policy.network, NetworkAllowlist)
        else None
    )
    ctx.metrics.network_denials.inc(len(denials or []))
    files = read_files(record.id, collector, ctx.artifacts) if run is not None else None
    errors = ctx.languages.error_rules(record.language, record.session_context) if run is not None else None
    outcome = decide(record, run, files, limits, errors, failure, denials, finished_at=time.time())
    if before_store is not None:
        before_store(run)
    through_outage("storing the outcome", lambda: _store(ctx, record, outcome, check, parent), patience_s)
    if ctx.pool is not None and session is None:
        ctx.pool.refill()  # only now: creating the successor would compete with the run and its result


def _run(
    ctx: Worker,
    record: ExecutionRecord,
    limits: Limits,
    collector: Collector,
    session: SessionSandbox | None,
    control: SandboxControl,
) -> tuple[SandboxOutcome | None, ExecutionError | None]:
    """The sandbox's outcome, or the service fault that kept it from giving one."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(ctx, record.id, record.attempt, control, stop), daemon=True)
    watcher.start()
    run: SandboxOutcome | None = None
    failure: ExecutionError | None = None
    metrics = ctx.metrics
    metrics.running.inc()
    metrics.queue_wait.labels(record.language).observe((record.timing.queue_wait_ms or 0.0) / 1000)
    if session is None:
        metrics.sandbox_starts.inc()  # a session call starts none
    lease = _egress_lease(ctx, record, limits)
    live = LiveOutput(ctx.store.redis, ctx.store.keys, record.id, limits.output_bytes, ctx.settings.retention_s)
    if ctx.pool is not None:
        ctx.pool.run_started()  # no refill starts while the run is in progress
    try:
        spec = dataclasses.replace(_spec(ctx, record, limits, collector, lease), on_output=live.write)
        run = ctx.runtime.run(spec, control) if session is None else session.run_cell(spec, record.code, control)
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
        live.close()  # before the result is stored: the live output precedes the `end` event
        if lease is not None:
            lease.drop()
        stop.set()
        try:
            ctx.store.signal(record.id, f"stop:{record.attempt}")  # wakes this attempt's watcher
        except QueueUnavailable as exc:  # it wakes on its own within its wait; the result matters more
            log.warning("could not wake the cancel watcher: %s", exc.message)
        watcher.join(timeout=5)
        metrics.running.dec()
        if ctx.pool is not None:
            ctx.pool.run_ended()
    _observe_run(ctx, record.language, run, failure, collector)
    return run, failure


def _store(
    ctx: Worker, taken: ExecutionRecord, outcome: Outcome, check: StatusCheck | None, parent: TraceContext
) -> None:
    """The terminal transition: the record takes the outcome; the same transaction announces it. A
    declared effect may instead send it round again (queued: its entry is queued once stored)."""

    def settle(record: ExecutionRecord) -> ExecutionStatus | None:
        # Only the attempt this worker took: one the reaper gave to another worker meanwhile (this
        # worker was declared lost) is that worker's to settle.
        if record.worker != ctx.name or record.attempt != taken.attempt:
            return None
        return after_run(outcome.apply, check, record)

    done = ctx.store.transition(taken.id, _ACTIVE, ctx.name, settle)
    if done is None:
        log.warning("execution was settled elsewhere (lease lost?) before its result was stored")
    elif done.status is ExecutionStatus.QUEUED:
        log.info("execution runs again in place", extra={"phase": done.phase, "code_runs": done.code_runs})
        requeue(ctx.store.redis, done, parent.child().traceparent, ctx.settings, ctx.backstop_s)
    else:
        category = done.error.category.value if done.error else None
        log.info("execution finished", extra={"status": done.status.value, "category": category})


def settle_lost(
    store: ExecutionStore, settings: ExecutionsConfig, backstop_s: int, execution_id: str, by: str
) -> ExecutionRecord | None:
    """A running execution whose lease lapsed, settled (None if it is not lost); queued again, it is
    put on its queue here, with a new span of its trace."""
    record = store.fail_if_lost(execution_id, by)
    if record is not None and record.status is ExecutionStatus.QUEUED:  # a declared effect that runs again
        log.info("a lost worker's execution %s runs again in place", execution_id)
        parent = TraceContext(record.trace_id, secrets.token_hex(8)).traceparent
        requeue(store.redis, record, parent, settings, backstop_s)
    return record


# -- what the sandbox is given ---------------------------------------------------------------------


def run_limits(policy: AppliedPolicy) -> Limits:
    """The part of an applied policy the sandbox runtime enforces."""
    return Limits(policy.timeout_s, policy.cpu, policy.cpu_time_s, policy.memory_mb, policy.pids,
                  policy.disk_mb, policy.output_bytes)  # fmt: skip


def _spec(
    ctx: Worker, record: ExecutionRecord, limits: Limits, collector: Collector, lease: RunEgress | None
) -> SandboxSpec:
    language = ctx.languages.get(record.language)
    # In a session the code goes to the kernel, not to a file.
    service_files = [(language.file, record.code.encode())] if record.session is None else []
    if record.inputs is not None:
        service_files.append((INPUTS_FILE, json.dumps(record.inputs).encode()))
    env = {
        **(dict(language.env) if record.session is None else {}),  # a session's kernel has the language's already
        **record.env,
        "EXECBOX_OUTPUT_DIR": f"{WORKDIR}/out",
        "EXECBOX_RESULT_FILE": f"{WORKDIR}/out/{RESULT_FILE}",
        "EXECBOX_INPUTS_FILE": f"{WORKDIR}/{INPUTS_FILE}",
        **{f"EXECBOX_{name.upper()}": value for name, value in record.context.items()},
    }
    return SandboxSpec(
        execution_id=record.id,
        trace_id=record.trace_id,
        worker=ctx.name,
        image=language.image,
        command=language.command,
        files=tuple(service_files),
        env=tuple(sorted(env.items())),
        limits=limits,
        language=language.name,
        deployment=ctx.settings.redis.key_prefix,
        input_archive=input_archive(ctx.files, record.files) if record.files else None,
        stdin=base64.b64decode(record.stdin_b64),
        collect_path="" if collector.root == "workspace" else "out",
        collector=collector,
        egress=None if lease is None else _egress(ctx, lease),
        runtime=record.policy.runtime,
        seccomp_deny=tuple(record.policy.seccomp_deny),
        submitted_at=record.created_at,
        session_context=record.session_context or "",
    )


def _egress_lease(ctx: Worker, record: ExecutionRecord, limits: Limits) -> RunEgress | None:
    """The run's hold on the egress path under an allowlist policy (None: no network at all)."""
    if not isinstance(record.policy.network, NetworkAllowlist):
        return None
    settings = ctx.settings.egress
    rule = EgressRule(
        execution_id=record.id,
        tenant=record.tenant,
        trace_id=record.trace_id,
        allow=tuple(record.policy.network.allow),
        max_connections=settings.max_connections,
        max_bytes=settings.max_bytes,
        connect_timeout_s=settings.connect_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
    )
    ttl_s = limits.timeout_s + ctx.settings.queue.setup_margin_s
    return RunEgress(ctx.egress, record.id, rule.to_json(), ttl_s, settings.slot_cooldown_s)


def _egress(ctx: Worker, lease: RunEgress) -> EgressSpec:
    settings = ctx.settings.egress
    return EgressSpec(settings.container, settings.port, settings.subnet_pool, lease, settings.slot_cooldown_s + 2.0)


# -- beside the run: lease, cancel, metrics, spans ---------------------------------------------------


def _watch(ctx: Worker, execution_id: str, attempt: int, control: SandboxControl, stop: threading.Event) -> None:
    """Renew the lease while the run lasts, and stop the sandbox when a cancel request arrives."""
    interval = max(ctx.settings.worker.lease_s / 3, 0.2)
    renew = False  # take() took the lease; from then on it is renewed before every wait
    while not stop.is_set():
        try:
            if renew:
                ctx.store.renew_lease(execution_id, ctx.name)
            renew = True
            message = ctx.store.wait_signal(execution_id, interval)
            if message == "cancel":
                log.info("cancel requested; stopping the sandbox")
                control.cancel()
                return
            if message == f"stop:{attempt}":
                return
        except ServiceError as exc:
            log.warning("lease renewal failed: %s", exc.message)
            stop.wait(interval)


def _observe_run(
    ctx: Worker, language: str, run: SandboxOutcome | None, failure: ExecutionError | None, collector: Collector
) -> None:
    metrics = ctx.metrics
    if run is None:
        metrics.sandbox_failures.labels(failure.details.get("code", "unknown") if failure else "unknown").inc()
        return
    metrics.sandbox_start.labels(language).observe(run.start_ms / 1000)
    metrics.run.labels(language).observe(run.run_ms / 1000)
    metrics.output_bytes.labels("stdout").inc(len(run.stdout))
    metrics.output_bytes.labels("stderr").inc(len(run.stderr))
    metrics.artifact_bytes.inc(sum(a.size for a in collector.kept))
    if run.oom_killed:
        metrics.oom_kills.labels(language).inc()


def _trace_run(ctx: Worker, record: ExecutionRecord, run: SandboxOutcome | None, parent: TraceContext) -> None:
    """Spans for each phase, placed back in time from the durations the run measured."""
    spans = ctx.spans
    if not spans.enabled:
        return
    end = time.time_ns()
    started = int((record.started_at or record.created_at) * 1e9)
    spans.record("execbox.queue_wait", parent, int(record.created_at * 1e9), started)
    spans.record("execbox.execution", parent, started, end, {"execution.id": record.id, "worker": ctx.name})
    if run is None:
        return
    collect_start = end - int(run.collect_ms * 1e6)
    run_start = collect_start - int(run.run_ms * 1e6)
    spans.record("execbox.sandbox_create", parent, run_start - int(run.start_ms * 1e6), run_start)
    spans.record("execbox.run", parent, run_start, collect_start, {"language": record.language})
    spans.record("execbox.collect", parent, collect_start, end)
