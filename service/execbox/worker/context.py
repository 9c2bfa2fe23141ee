"""What a worker process builds once and every job reuses: settings, store, runtime, languages."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from execbox import store as store_mod
from execbox.artifact_store import ArtifactStore, LocalArtifactStore
from execbox.languages import Languages
from execbox.metrics import WorkerMetrics, worker_metrics
from execbox.queue import make_webhook_queue, webhook_notifier
from execbox.sandbox.base import Runtime
from execbox.sandbox.docker import DockerRuntime
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

    @classmethod
    def build(cls, settings: Settings, name: str | None = None) -> WorkerContext:
        registry = CollectorRegistry()
        context = cls(
            settings=settings,
            store=store_mod.ExecutionStore(store_mod.connect(settings), settings),
            runtime=DockerRuntime(settings.docker),
            languages=Languages.load(settings.images_dir),
            artifacts=LocalArtifactStore(settings.artifacts_dir),
            # A random part: a restarted container has the same host name and, as PID 1, the same pid.
            name=name or f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}",
            metrics=worker_metrics(registry),
            registry=registry,
            spans=setup_tracing(settings.telemetry.otlp_endpoint, "execbox-worker"),
        )
        context.store.terminal_hooks += [
            context.metrics.outcomes.observe,
            webhook_notifier(make_webhook_queue(context.store.redis, settings), settings),
        ]
        return context


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
