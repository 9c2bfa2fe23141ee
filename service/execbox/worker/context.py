"""What a worker process builds once and every job reuses: settings, store, runtime, languages."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from execbox import store as store_mod
from execbox.artifact_store import ArtifactStore, LocalArtifactStore
from execbox.errors import ServiceError
from execbox.languages import Languages
from execbox.metrics import WorkerMetrics, worker_metrics
from execbox.models import PolicyRequest
from execbox.policies import PolicySet, run_limits
from execbox.sandbox.base import RunSpec, Runtime
from execbox.sandbox.docker import DockerRuntime
from execbox.sandbox.pool import PoolClass, WarmPool
from execbox.sandbox.uids import SharedUids
from execbox.settings import Settings
from execbox.tracing import Spans
from execbox.tracing import setup as setup_tracing


@dataclass
class WorkerContext:
    settings: Settings
    store: store_mod.ExecutionStore
    runtime: Runtime
    languages: Languages
    artifacts: ArtifactStore
    name: str
    metrics: WorkerMetrics
    registry: CollectorRegistry
    spans: Spans
    pool: WarmPool | None = None

    @classmethod
    def build(cls, settings: Settings, name: str | None = None) -> WorkerContext:
        registry = CollectorRegistry()
        store = store_mod.ExecutionStore(store_mod.connect(settings), settings)
        uids = SharedUids(settings.docker.uid_range, store.reserve_uid, store.release_uid)
        runtime = DockerRuntime(settings.docker, uids, settings.policies_dir)
        context = cls(
            settings=settings,
            store=store,
            runtime=runtime,
            languages=Languages.load(settings.images_dir),
            artifacts=LocalArtifactStore(settings.artifacts_dir),
            # A random part: a restarted container has the same host name and, as PID 1, the same pid.
            name=name or f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}",
            metrics=worker_metrics(registry),
            registry=registry,
            spans=setup_tracing(settings.telemetry.otlp_endpoint, "execbox-worker"),
        )
        runtime.on_status_mismatch = context.metrics.status_mismatches.inc
        if settings.pool.sizes:
            context.pool = runtime.pool = build_pool(context, runtime)
        context.store.terminal_hooks.append(context.metrics.outcomes.observe)
        return context


def build_pool(ctx: WorkerContext, runtime: DockerRuntime) -> WarmPool:
    """One pool class per configured language, with the default policy's limits."""
    default = PolicySet.load(ctx.settings.policies_dir).resolve(PolicyRequest(), 0)
    limits = run_limits(default)
    classes = []
    for name, size in ctx.settings.pool.sizes.items():
        try:
            language = ctx.languages.get(name)
        except ServiceError as exc:
            raise ValueError(f"EXECBOX_POOL__SIZES: {exc.message}") from exc
        template = RunSpec(execution_id="", trace_id="", worker=ctx.name, image=language.image,
                           command=language.command, files=(), env=(), limits=limits,
                           language=language.name, deployment=ctx.settings.redis.key_prefix,
                           runtime=default.runtime or ctx.settings.docker.runtime or "runc",
                           seccomp_deny=tuple(default.seccomp_deny))  # fmt: skip
        classes.append(PoolClass(language.name, size, template))
    metrics = ctx.metrics
    return WarmPool(
        runtime,
        classes,
        ctx.name,
        ctx.settings.redis.key_prefix,
        ctx.settings.pool.max_idle_s,
        on_take=lambda language, hit: metrics.pool_takes.labels(language, "hit" if hit else "miss").inc(),
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
