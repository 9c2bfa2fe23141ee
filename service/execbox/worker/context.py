"""What a worker process builds once and every job reuses: settings, stores, runtime, languages."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from execbox.assembly import foundation
from execbox.catalog.languages import Languages
from execbox.catalog.policies import DEFAULT_POLICY, PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.core.errors import ServiceError
from execbox.core.tracing import Spans
from execbox.core.tracing import setup as setup_tracing
from execbox.egress.store import EgressStore
from execbox.executions import events
from execbox.executions.lifecycle import run_limits
from execbox.executions.metrics import WorkerMetrics, worker_metrics
from execbox.executions.record import ExecutionRecord
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.files.blobs import ArtifactStore
from execbox.files.store import FileStore
from execbox.fleet.metrics import NodeMetrics, node_metrics
from execbox.fleet.nodes import DrainWatch, Nodes, node_problem
from execbox.fleet.registry import Heartbeat, WorkerRegistry
from execbox.sandbox.docker import DockerRuntime
from execbox.sandbox.pool import PoolClass, Sizing, WarmPool
from execbox.sandbox.runtime import Runtime, SandboxSpec
from execbox.sandbox.uids import redis_uids
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from execbox.tenancy.quotas import Slots
from execbox.worker.failures import SANDBOX_FAILURE_REASONS

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    settings: Settings
    store: ExecutionStore
    files: FileStore
    egress: EgressStore
    fleet: WorkerRegistry
    slots: Slots
    runtime: Runtime
    languages: Languages
    artifacts: ArtifactStore
    name: str
    metrics: WorkerMetrics
    registry: CollectorRegistry
    spans: Spans
    sessions: SessionStore
    backstop_s: int
    """The longest run any policy allows: RQ's last-resort timeout for the tickets a worker restores."""
    node: str
    """The node (host) it runs on: EXECBOX_WORKER__NODE, else the host name."""
    nodes: Nodes
    drain: DrainWatch
    """Whether its node is drained (it then takes no ticket and no session)."""
    node_metrics: NodeMetrics
    pool: WarmPool | None = None
    last_beat: Heartbeat | None = None
    """The heartbeat the reaper last sent (a drain seen between two is told at once with it)."""

    @classmethod
    def build(cls, settings: Settings, name: str | None = None, runtime: Runtime | None = None) -> WorkerContext:
        """`runtime`: the sandboxes to run in; None (production) builds the Docker runtime and its pool."""
        registry = CollectorRegistry()
        node = settings.worker.node or socket.gethostname()
        problem = node_problem(node)
        if problem is not None:  # only the host name can get here: the setting is checked when it is read
            raise ValueError(f"EXECBOX_WORKER__NODE: unset, and the host name {problem}; set it")
        base = foundation(settings)
        client, keys, store = base.redis, base.keys, base.store
        nodes = Nodes(client, keys)
        metrics_of_nodes = node_metrics(registry)
        docker = None
        if runtime is None:
            runtime = docker = DockerRuntime(
                settings.docker,
                redis_uids(client, keys, settings.docker.uid_range, patience_s=settings.worker.lease_s),
                settings.policies_dir,
            )
        context = cls(
            settings=settings,
            store=store,
            files=base.files,
            egress=EgressStore(client, keys, settings.retention_s),
            fleet=base.fleet,
            slots=Slots(client, keys),
            runtime=runtime,
            languages=base.languages,
            artifacts=base.artifacts,
            # A random part: a restarted container has the same host name and, as PID 1, the same pid.
            name=name or f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}",
            metrics=worker_metrics(registry),
            registry=registry,
            spans=setup_tracing(settings.telemetry.otlp_endpoint, "execbox-worker"),
            sessions=SessionStore(client, keys, settings.retention_s),
            backstop_s=base.policies.max_ceiling("timeout_s"),
            node=node,
            nodes=nodes,
            drain=DrainWatch(nodes, node),
            node_metrics=metrics_of_nodes,
        )
        metrics_of_nodes.initialise(node, (status.value for status in ExecutionStatus if status.terminal))
        store.listeners.append(context._count_for_node)
        context.drain.on_change = context._drain_changed
        context.metrics.initialise((lang.name for lang in context.languages), SANDBOX_FAILURE_REASONS)
        if docker is not None:  # the warm pool and the launcher's status check are Docker's own
            docker.on_status_mismatch = context.metrics.status_mismatches.inc
            if settings.pool.all_classes():
                context.pool = docker.pool = build_pool(context, docker, base.policies)
        events.subscribe(store, context.metrics.outcomes)
        return context

    def _drain_changed(self, draining: bool) -> None:
        """Say it in the metric and the heartbeat now, not at the next sweep."""
        self.node_metrics.draining.set(1 if draining else 0)
        beat = self.last_beat
        if beat is None:
            return
        slots = 0 if draining else self.settings.sessions.per_worker
        try:
            self.fleet.report(
                replace(beat, draining=draining, session_slots=slots), 3 * self.settings.worker.reaper_interval_s
            )
        except ServiceError as exc:
            log.warning("could not report the drain in the heartbeat: %s", exc.message)

    def _count_for_node(self, record: ExecutionRecord) -> None:
        """An execution that ran on a node ended (here, or failed as lost by this worker's reaper): count it
        for that node. Runs after the terminal transaction, so it must never raise into the lifecycle."""
        if record.node is None:
            return
        self.node_metrics.executions.labels(record.node, record.status.value).inc()
        try:
            self.nodes.count_finished(record.node)
        except Exception as exc:  # a lost count, never a lost outcome
            log.warning("could not count execution %s for node %s: %s", record.id, record.node, exc)


def build_pool(ctx: WorkerContext, runtime: DockerRuntime, policies: PolicySet) -> WarmPool:
    """One pool class per configured language (or variant) and policy, with that policy's limits."""
    settings = ctx.settings.pool
    classes = []
    for i, wanted in enumerate(settings.all_classes()):
        try:
            language = ctx.languages.get(wanted.language)
            policy = policies.resolve(PolicyRequest(name=wanted.policy), 0)
        except ServiceError as exc:
            raise ValueError(f"EXECBOX_POOL__CLASSES.{i}: {exc.message}") from exc
        template = SandboxSpec(execution_id="", trace_id="", worker=ctx.name, image=language.image,
                           command=language.command, files=(), env=(), limits=run_limits(policy),
                           language=language.name, deployment=ctx.settings.redis.key_prefix,
                           runtime=policy.runtime or ctx.settings.docker.runtime or "runc",
                           seccomp_deny=tuple(policy.seccomp_deny),
                           container_env=language.preload_env() if settings.preload else ())  # fmt: skip
        name = language.name if wanted.policy == DEFAULT_POLICY else f"{language.name}:{wanted.policy}"
        classes.append(PoolClass(name, template, wanted.min, wanted.max))
    metrics = ctx.metrics
    metrics.initialise_pool([c.name for c in classes])
    sizing = Sizing(settings.window_s, settings.refill_parallelism, settings.memory_budget_mb,
                    settings.refill_during_runs)  # fmt: skip
    return WarmPool(
        runtime,
        classes,
        ctx.name,
        ctx.settings.redis.key_prefix,
        settings.max_idle_s,
        sizing,
        on_take=lambda name, hit: metrics.pool_takes.labels(name, "hit" if hit else "miss").inc(),
        on_refill=lambda name, seconds: metrics.pool_refill.labels(name).observe(seconds),
        on_target=lambda name, target: metrics.pool_target.labels(name).set(target),
    )


_current: WorkerContext | None = None


def install(context: WorkerContext) -> None:
    global _current
    _current = context


def current() -> WorkerContext:
    """The worker's context; built from the environment when a plain `rq worker` runs the job."""
    global _current
    if _current is None:
        _current = WorkerContext.build(Settings())
    return _current
