"""run_next: the RQ entry point. Take the next execution (fair across tenants), start it in a
sandbox, classify, store."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import logging
import tarfile
import threading
import time
from collections.abc import Callable
from secrets import token_hex
from typing import Any

from execbox.catalog.schemas import NetworkAllowlist
from execbox.core import logs
from execbox.core.errors import ServiceError
from execbox.core.status import ErrorCategory, ExecutionStatus
from execbox.core.tracing import TraceContext, parse_traceparent
from execbox.egress.rules import EgressRule
from execbox.executions.inputs import INPUTS_FILE
from execbox.executions.live import LiveOutput
from execbox.executions.queue import take_next
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, NetworkDenial, NetworkReport
from execbox.executions.store import mark_expired_if_due
from execbox.files.collect import RESULT_FILE, ArtifactCaps, Collector
from execbox.files.errors import InputUnavailable
from execbox.files.schemas import InputFileRef
from execbox.sandbox.runtime import WORKDIR, EgressSpec, Limits, RunControl, RunOutcome, RunSpec, SessionSandbox
from execbox.worker.context import WorkerContext, current, run_limits
from execbox.worker.results import apply_outcome, blame_network

log = logging.getLogger(__name__)
_ACTIVE = {ExecutionStatus.RUNNING}


def run_next(_: dict[str, Any]) -> str:
    """A dispatch ticket: run the next execution that can start; skip cancelled or expired ones."""
    ctx = current()
    while (entry := take_next(ctx.store.redis, ctx.settings)) is not None:
        # Not reset on return: RQ's own lines about this job ("Job OK") then name the execution
        # too; the worker's per-job scope ends the binding.
        logs.bind(None, entry.execution_id)
        record = start(ctx, entry.execution_id)
        if record is None:
            continue
        logs.bind(record.trace_id, entry.execution_id)
        parent = parse_traceparent(entry.traceparent) or TraceContext(record.trace_id, token_hex(8))
        run_and_finish(ctx, record, parent)
        return entry.execution_id
    logs.bind(None, None)
    return "nothing to run"


def start(ctx: WorkerContext, execution_id: str) -> ExecutionRecord | None:
    """queued → running, with the run's lease, in one transaction; None when it expired, was
    cancelled, or is gone."""

    def take(record: ExecutionRecord) -> ExecutionStatus | None:
        if mark_expired_if_due(record) is not None:
            return ExecutionStatus.EXPIRED
        record.started_at = time.time()
        record.worker = ctx.name
        record.policy.runtime = record.policy.runtime or ctx.settings.docker.runtime or "runc"
        record.attempt += 1
        record.timing.queue_wait_ms = round((record.started_at - record.created_at) * 1000, 1)
        return ExecutionStatus.RUNNING

    record = ctx.store.transition(execution_id, {ExecutionStatus.QUEUED}, ctx.name, take, lease=True)
    if record is None:
        log.info("execution not queued any more (cancelled or gone); skipped")
    elif record.status is ExecutionStatus.EXPIRED:
        log.info("execution expired in the queue")
        return None
    return record


def run_and_finish(
    ctx: WorkerContext,
    record: ExecutionRecord,
    parent: TraceContext,
    session: SessionSandbox | None = None,
    control: RunControl | None = None,
    before_store: Callable[[RunOutcome | None], None] | None = None,
) -> None:
    """Run a started execution (in a fresh sandbox, or as a call in `session`) and store its result;
    `before_store` is told the outcome first."""
    control = control or RunControl()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(ctx, record.id, control, stop), daemon=True)
    watcher.start()
    p = record.policy
    limits = run_limits(p)
    collector = Collector(
        record.id,
        ctx.artifacts,
        ArtifactCaps(p.artifact_file_bytes, p.artifact_total_bytes, p.artifact_files),
        root="workspace" if record.outputs_spec.files else "out",
        globs=tuple(record.outputs_spec.files),
    )
    outcome: RunOutcome | None = None
    failure: ExecutionError | None = None
    metrics = ctx.metrics
    metrics.running.inc()
    metrics.queue_wait.labels(record.language).observe((record.timing.queue_wait_ms or 0.0) / 1000)
    if session is None:
        metrics.sandbox_starts.inc()  # a session call starts none
    registered: list[str] = []  # the proxy addresses this run's egress rule is stored under
    live = LiveOutput(ctx.store.redis, ctx.store.keys, record.id, limits.output_bytes, ctx.settings.retention_s)
    if ctx.pool is not None:
        ctx.pool.run_started()  # no refill starts while the run is in progress
    try:
        spec = dataclasses.replace(_spec(ctx, record, limits, collector, registered), on_output=live.write)
        outcome = ctx.runtime.run(spec, control) if session is None else session.run_cell(spec, record.code, control)
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
        for address in registered:
            _quietly(ctx.egress.drop_rule, address)  # it expires anyway
        stop.set()
        ctx.store.signal(record.id, "stop")  # wakes the watcher out of its blocking wait
        watcher.join(timeout=5)
        metrics.running.dec()
        if ctx.pool is not None:
            ctx.pool.run_ended()
    _observe_run(ctx, record.language, outcome, failure, collector)
    _trace_run(ctx, record, outcome, parent)
    denials = ctx.egress.denials(record.id) if isinstance(record.policy.network, NetworkAllowlist) else []
    ctx.metrics.network_denials.inc(len(denials))
    if before_store is not None:
        before_store(outcome)
    _finish(ctx, record.id, outcome, failure, limits, collector, denials)
    if ctx.pool is not None and session is None:
        ctx.pool.refill()  # only now: creating the successor would compete with the run and its result


def _trace_run(ctx: WorkerContext, record: ExecutionRecord, outcome: RunOutcome | None, parent: TraceContext) -> None:
    """Spans for each phase, placed back in time from the durations the run measured."""
    spans = ctx.spans
    if not spans.enabled:
        return
    end = time.time_ns()
    started = int((record.started_at or record.created_at) * 1e9)
    spans.record("execbox.queue_wait", parent, int(record.created_at * 1e9), started)
    spans.record("execbox.execution", parent, started, end, {"execution.id": record.id, "worker": ctx.name})
    if outcome is None:
        return
    collect_start = end - int(outcome.collect_ms * 1e6)
    run_start = collect_start - int(outcome.run_ms * 1e6)
    spans.record("execbox.sandbox_create", parent, run_start - int(outcome.start_ms * 1e6), run_start)
    spans.record("execbox.run", parent, run_start, collect_start, {"language": record.language})
    spans.record("execbox.collect", parent, collect_start, end)


def _observe_run(
    ctx: WorkerContext, language: str, outcome: RunOutcome | None, failure: ExecutionError | None, collector: Collector
) -> None:
    metrics = ctx.metrics
    if outcome is None:
        metrics.sandbox_failures.labels(failure.details.get("code", "unknown") if failure else "unknown").inc()
        return
    metrics.sandbox_start.labels(language).observe(outcome.start_ms / 1000)
    metrics.run.labels(language).observe(outcome.run_ms / 1000)
    metrics.output_bytes.labels("stdout").inc(len(outcome.stdout))
    metrics.output_bytes.labels("stderr").inc(len(outcome.stderr))
    metrics.artifact_bytes.inc(sum(a.size for a in collector.kept))
    if outcome.oom_killed:
        metrics.oom_kills.labels(language).inc()


def _spec(
    ctx: WorkerContext, record: ExecutionRecord, limits: Limits, collector: Collector, registered: list[str]
) -> RunSpec:
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
    egress = None
    if isinstance(record.policy.network, NetworkAllowlist):
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
        ttl = limits.timeout_s + ctx.settings.queue.setup_margin_s

        def register(address: str) -> None:
            ctx.egress.put_rule(address, rule.to_json(), ttl)
            registered.append(address)

        store, execution_id = ctx.egress, record.id
        egress = EgressSpec(
            settings.container,
            settings.port,
            settings.subnet_pool,
            register,
            # Held for the run (and its clean-up), then cooling down: see execbox.egress.main.
            reserve=lambda subnet: store.reserve_slot(subnet, execution_id, ttl + settings.slot_cooldown_s),
            release=lambda subnet: store.cool_slot(subnet, execution_id, settings.slot_cooldown_s),
            slot_wait_s=settings.slot_cooldown_s + 2.0,
        )
    return RunSpec(
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
        input_archive=input_archive(ctx, record.files) if record.files else None,
        stdin=base64.b64decode(record.stdin_b64),
        collect_path="" if collector.root == "workspace" else "out",
        collector=collector,
        egress=egress,
        runtime=record.policy.runtime,
        seccomp_deny=tuple(record.policy.seccomp_deny),
        submitted_at=record.created_at,
    )


def input_archive(ctx: WorkerContext, files: list[InputFileRef]) -> bytes:
    """A tar of the input files for the engine's archive API.

    Files belong to root (mode 0644): the program reads them but, with the kernel's
    protected_hardlinks, cannot hard-link them into its output directory; directories are
    writable by anyone (the sandbox's own uid is chosen later, and it is alone in there) so it can
    still add files next to its inputs.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        made: set[str] = set()
        for ref in files:
            data = ctx.files.data(ref.file_id)
            if data is None:
                raise InputUnavailable(ref.path, ref.file_id)
            parts = ref.path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    tar.addfile(_tar_entry(directory, tarfile.DIRTYPE, 0o777))
            tar.addfile(_tar_entry(ref.path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return buffer.getvalue()


def _tar_entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.uid = info.gid = 0
    info.mtime = int(time.time())
    return info


def _finish(
    ctx: WorkerContext,
    execution_id: str,
    outcome: RunOutcome | None,
    failure: ExecutionError | None,
    limits: Limits,
    collector: Collector,
    denials: list[dict[str, object]],
) -> None:
    def apply(record: ExecutionRecord) -> ExecutionStatus:
        now = time.time()
        status = ExecutionStatus.FAILED
        if outcome is not None:
            errors = ctx.languages.get(record.language).errors
            status = apply_outcome(record, outcome, collector, limits, ctx.artifacts, errors)
        else:
            record.error = failure
        if outcome is not None and outcome.kernel_restarted:
            _note_restart(record, outcome)
        if isinstance(record.policy.network, NetworkAllowlist):
            record.network = NetworkReport(denied=[NetworkDenial.model_validate(d) for d in denials])
            blame_network(record)
        record.timing.total_ms = round((now - record.created_at) * 1000, 1)
        record.finished_at = now
        return status

    done = ctx.store.transition(execution_id, _ACTIVE, ctx.name, apply)
    if done is None:
        log.warning("execution was settled elsewhere (lease lost?) before its result was stored")
    else:
        category = done.error.category.value if done.error else None
        log.info("execution finished", extra={"status": done.status.value, "category": category})


def _note_restart(record: ExecutionRecord, outcome: RunOutcome) -> None:
    """A session's call after which the kernel was restarted, or the session was lost: say so."""
    record.kernel_restarted = True
    if outcome.cancelled:
        return  # the client's cancel (or its DELETE of the session) says enough
    if outcome.launcher_fault:
        note = f"the session ended ({outcome.launcher_fault}): its state is lost; open a new session"
        if record.error is not None:
            record.error = record.error.model_copy(update={"message": note, "retryable": False})
        return
    note = (outcome.session_note or "the kernel was restarted") + (
        "; the session goes on with a fresh interpreter: earlier variables and imports are gone, files in "
        "/workspace remain"
    )
    if record.error is not None:
        details = {**record.error.details, "kernel_restarted": True}
        record.error = record.error.model_copy(
            update={"message": f"{record.error.message}. {note}", "details": details}
        )


def _quietly(action: Callable[[str], None], arg: str) -> None:
    try:
        action(arg)
    except ServiceError as exc:
        log.warning("clean-up step failed: %s", exc.message)


def _watch(ctx: WorkerContext, execution_id: str, control: RunControl, stop: threading.Event) -> None:
    """Renew the lease while the run lasts, and stop the sandbox when a cancel request arrives."""
    interval = max(ctx.settings.worker.lease_s / 3, 0.2)
    renew = False  # start() took the lease; from then on it is renewed before every wait
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
            if message == "stop":
                return
        except ServiceError as exc:
            log.warning("lease renewal failed: %s", exc.message)
            stop.wait(interval)
