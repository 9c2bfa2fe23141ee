"""What a worker process builds once and every job reuses: settings, stores, runtime, languages."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from execbox.catalog.languages import Languages
from execbox.catalog.policies import DEFAULT_POLICY, PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.core.errors import ServiceError
from execbox.core.redis import connect
from execbox.core.tracing import Spans
from execbox.core.tracing import setup as setup_tracing
from execbox.egress.store import EgressStore
from execbox.executions import events
from execbox.executions.lifecycle import run_limits
from execbox.executions.metrics import WorkerMetrics, worker_metrics
from execbox.executions.store import ExecutionStore
from execbox.files.backend import open_store
from execbox.files.blobs import ArtifactStore
from execbox.files.store import FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.keyschema import Keys
from execbox.sandbox.docker import DockerRuntime
from execbox.sandbox.pool import PoolClass, Sizing, WarmPool
from execbox.sandbox.runtime import Runtime, SandboxSpec
from execbox.sandbox.uids import redis_uids
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from execbox.tenancy.quotas import Slots
from execbox.worker.failures import SANDBOX_FAILURE_REASONS


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
    pool: WarmPool | None = None

    @classmethod
    def build(cls, settings: Settings, name: str | None = None, runtime: Runtime | None = None) -> WorkerContext:
        """`runtime`: the sandboxes to run in; None (production) builds the Docker runtime and its pool."""
        registry = CollectorRegistry()
        client = connect(settings)
        keys = Keys(settings.redis.key_prefix)
        store = ExecutionStore(client, settings)
        docker = None
        if runtime is None:
            runtime = docker = DockerRuntime(
                settings.docker, redis_uids(client, keys, settings.docker.uid_range), settings.policies_dir
            )
        context = cls(
            settings=settings,
            store=store,
            files=FileStore(client, keys),
            egress=EgressStore(client, keys, settings.retention_s),
            fleet=WorkerRegistry(client, keys),
            slots=Slots(client, keys),
            runtime=runtime,
            languages=Languages.load(settings.images_dir),
            artifacts=open_store(settings.artifacts, settings.artifacts_dir),
            # A random part: a restarted container has the same host name and, as PID 1, the same pid.
            name=name or f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}",
            metrics=worker_metrics(registry),
            registry=registry,
            spans=setup_tracing(settings.telemetry.otlp_endpoint, "execbox-worker"),
            sessions=SessionStore(client, keys, settings.retention_s),
            backstop_s=PolicySet.load(settings.policies_dir).max_ceiling("timeout_s"),
        )
        context.metrics.initialise((lang.name for lang in context.languages), SANDBOX_FAILURE_REASONS)
        if docker is not None:  # the warm pool and the launcher's status check are Docker's own
            docker.on_status_mismatch = context.metrics.status_mismatches.inc
            if settings.pool.all_classes():
                context.pool = docker.pool = build_pool(context, docker)
        events.subscribe(store, context.metrics.outcomes)
        return context


def build_pool(ctx: WorkerContext, runtime: DockerRuntime) -> WarmPool:
    """One pool class per configured language (or variant) and policy, with that policy's limits."""
    settings = ctx.settings.pool
    policies = PolicySet.load(ctx.settings.policies_dir)
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
