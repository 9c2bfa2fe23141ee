"""The REST API: create_app(settings) builds the FastAPI application."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry
from rq import Queue

from execbox import __version__
from execbox.api import console, limits, mcp, problems
from execbox.api.deps import Services
from execbox.api.metrics import HttpMetrics, SharedStateCollector, api_metrics
from execbox.api.routes import admin, e2b, executions, files, health, languages, runs, schedules, scripts
from execbox.api.routes import sessions as sessions_routes
from execbox.assembly import assemble
from execbox.core import logs
from execbox.core.keymigration import migrate_at_start as migrate_keys
from execbox.core.metrics import DeadLetterCollector
from execbox.core.poison import Loops
from execbox.e2b.contexts import ContextBook
from execbox.e2b.envd import Envd
from execbox.e2b.interpreter import Interpreter
from execbox.e2b.sandboxes import Sandboxes
from execbox.e2b.watchers import WatcherBook
from execbox.executions.queue import depth
from execbox.executions.schemas import ExecutionCreate
from execbox.executions.store import ExecutionStore
from execbox.executions.waits import Waiters
from execbox.files.backend import prepare
from execbox.fleet.registry import WorkerRegistry
from execbox.keyschema import LOOPS
from execbox.plans.consumer import PlanConsumer
from execbox.settings import Settings
from execbox.tenancy.signins import SignIns

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    logs.configure(settings.log_level, "api")
    registry = CollectorRegistry()
    plane = assemble(settings, registry)
    client, keys = plane.redis, plane.keys
    waiters = Waiters(settings)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(migrate_keys, client, keys)  # data of the older key layout, before any reader
        # A wrong S3 endpoint, bucket or key fails the start, where the operator looks first; /readyz
        # does not ask S3, so an object store that is down stops downloads, not every route.
        await prepare(plane.artifacts)
        await waiters.start()
        loops: Loops = app.state.loops  # each supervised: restarted if it dies, reported by /readyz
        consumer = PlanConsumer(plane.runs.executor, _process_name(), settings.plans.claim_idle_s, plane.metrics.loops)
        loops.start("plans", consumer.run)
        loops.start("scheduler", plane.schedules.run)
        surprises_name = _process_name()
        loops.start("surprises", lambda stop: plane.surprises.run(stop, surprises_name, plane.metrics.loops))
        try:
            async with app.state.mcp_sessions:
                yield
        finally:
            stop.set()
            await asyncio.to_thread(loops.join, 10.0)
            await waiters.close()
            plane.close()

    app = FastAPI(
        lifespan=lifespan,
        title="execbox",
        version=__version__,
        description="Sandboxed code execution for AI agents: submit code with a resource policy, get back "
        "output, a categorized error, timings and a trace id.",
    )
    metrics = api_metrics(registry, plane.metrics)
    registry.register(SharedStateCollector(lambda: shared_state(plane.store, plane.fleet, plane.queue)))
    registry.register(DeadLetterCollector(plane.dead_letters.counts))
    app.state.loops = Loops(stop, LOOPS, plane.metrics.loops)
    sessions = plane.sessions
    app.state.services = Services(
        settings=settings,
        store=plane.store,
        executions=plane.executions,
        files=plane.files,
        fleet=plane.fleet,
        queue=plane.queue,
        policies=plane.policies,
        languages=plane.languages,
        artifacts=plane.artifacts,
        metrics=metrics,
        registry=registry,
        spans=plane.spans,
        idempotency=plane.idempotency,
        keys=plane.api_keys,
        quotas=plane.quotas,
        waiters=waiters,
        runs=plane.runs,
        scripts=plane.scripts,
        schedules=plane.schedules,
        surprises=plane.surprises,
        sessions=sessions,
        sandboxes=Sandboxes(settings.e2b, sessions, client, keys, settings.retention_s),
        interpreter=Interpreter(
            plane.executions,
            sessions,
            plane.artifacts,
            waiters.streams,
            keys,
            int(settings.api.sse_keepalive_s * 1000),
            waiters,
            ContextBook(client, keys, settings.sessions.max_lifetime_s + settings.retention_s),
            settings.e2b.call_timeout_s,
        ),  # fmt: skip
        envd=Envd(sessions.store, waiters.streams, keys, settings.e2b.max_file_bytes, settings.e2b.call_timeout_s),
        watchers=WatcherBook(client, keys, settings.sessions.max_lifetime_s + settings.retention_s),
        console=SignIns(client, keys, plane.api_keys),
        dead_letters=plane.dead_letters,
    )
    foreign = {"/e2b/": e2b.error_response} if settings.e2b.enabled else {}
    problems.install(app, foreign)
    limits.install(app, settings.api, plane.policies, app.state.foreign_shapes)
    app.add_middleware(HttpMetrics, metrics=metrics, routes=app.routes)
    app.include_router(executions.router)
    app.include_router(files.router)
    app.include_router(runs.router)
    app.include_router(scripts.router)
    app.include_router(schedules.router)
    app.include_router(schedules.events_router)
    app.include_router(sessions_routes.router)
    app.include_router(admin.router)
    app.include_router(languages.router)
    app.include_router(health.router)
    console.install(app)
    if settings.e2b.enabled:
        app.include_router(e2b.control)
        app.include_router(e2b.sandbox)
    _document_request_models(app)
    app.state.mcp_sessions = mcp.mount(app)
    return app


def shared_state(store: ExecutionStore, fleet: WorkerRegistry, queue: Queue) -> dict[str, float]:
    workers = fleet.alive()
    used, limit = store.memory()
    return {
        "execbox_queue_depth": float(depth(queue)),
        "execbox_executions_running": float(len(store.running())),
        "execbox_workers_alive": float(len(workers)),
        "execbox_workers_docker_ok": float(sum(1 for w in workers if w.docker_ok)),
        "execbox_warm_pool_size": float(sum(w.warm for w in workers)),
        "execbox_redis_memory_used_bytes": float(used),
        "execbox_redis_memory_max_bytes": float(limit),
    }


def _document_request_models(app: FastAPI) -> None:
    """Routes that read their body themselves (JSON or multipart) still get their schema documented."""

    def openapi() -> dict[str, object]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            extra = ExecutionCreate.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(extra.pop("$defs", {}))
            components["ExecutionCreate"] = extra
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _process_name() -> str:
    """This API process's consumer name (a restarted container keeps its host name and pid)."""
    return f"api-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
