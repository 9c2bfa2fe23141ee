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
from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.core import logs
from execbox.core.deadletters import DeadLetters
from execbox.core.keymigration import migrate_at_start as migrate_keys
from execbox.core.metrics import DeadLetterCollector
from execbox.core.poison import LOOPS, Loops
from execbox.core.redis import connect
from execbox.core.tracing import setup as setup_tracing
from execbox.e2b.contexts import ContextBook
from execbox.e2b.envd import Envd
from execbox.e2b.interpreter import Interpreter
from execbox.e2b.sandboxes import Sandboxes
from execbox.e2b.watchers import WatcherBook
from execbox.executions import events
from execbox.executions.idempotency import IdempotencyKeys
from execbox.executions.queue import depth, make_queue
from execbox.executions.schemas import ExecutionCreate
from execbox.executions.store import ExecutionStore
from execbox.executions.submit import Submissions
from execbox.executions.waits import Waiters
from execbox.files.backend import input_blobs, open_store, prepare
from execbox.files.store import FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.keyschema import Keys
from execbox.library.service import Library
from execbox.library.store import ScriptStore
from execbox.plans.approvals import ExecutionGate
from execbox.plans.consumer import PlanConsumer
from execbox.plans.executor import Executor
from execbox.plans.runs import Runs
from execbox.plans.store import RunStore
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.store import ScheduleStore
from execbox.schedules.surprises import Surprises
from execbox.sessions.service import Sessions
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.quotas import Quotas, Slots
from execbox.tenancy.signins import SignIns

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    logs.configure(settings.log_level, "api")
    client = connect(settings)
    waiters = Waiters(settings)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(migrate_keys, client, keys)  # data of the older key layout, before any reader
        # A wrong S3 endpoint, bucket or key fails the start, where the operator looks first; /readyz
        # does not ask S3, so an object store that is down stops downloads, not every route.
        await prepare(artifacts)
        await waiters.start()
        services = app.state.services
        loops: Loops = app.state.loops  # each supervised: restarted if it dies, reported by /readyz
        consumer = PlanConsumer(services.runs.executor, _process_name(), settings.plans.claim_idle_s, metrics.loops)
        loops.start("plans", consumer.run)
        loops.start("scheduler", services.schedules.run)
        surprises_name = _process_name()
        loops.start("surprises", lambda stop: services.surprises.run(stop, surprises_name, metrics.loops))
        try:
            async with app.state.mcp_sessions:
                yield
        finally:
            stop.set()
            await asyncio.to_thread(loops.join, 10.0)
            await waiters.close()
            client.close()

    app = FastAPI(
        lifespan=lifespan,
        title="execbox",
        version=__version__,
        description="Sandboxed code execution for AI agents: submit code with a resource policy, get back "
        "output, a categorized error, timings and a trace id.",
    )
    registry = CollectorRegistry()
    metrics = api_metrics(registry)
    keys = Keys(settings.redis.key_prefix)
    store = ExecutionStore(client, settings)
    events.subscribe(store, metrics.outcomes)
    queue = make_queue(client, settings)
    fleet = WorkerRegistry(client, keys)
    registry.register(SharedStateCollector(lambda: shared_state(store, fleet, queue)))
    dead_letters = DeadLetters(client, keys)
    registry.register(DeadLetterCollector(dead_letters.counts))
    metrics.loops.initialise(LOOPS)
    app.state.loops = Loops(stop, metrics.loops)
    artifacts = open_store(settings.artifacts, settings.artifacts_dir)
    file_store = FileStore(client, keys, input_blobs(artifacts, settings.redis.key_prefix))
    policies = PolicySet.load(settings.policies_dir)
    language_set = Languages.load(settings.images_dir)
    spans = setup_tracing(settings.telemetry.otlp_endpoint, "execbox-api")
    idempotency = IdempotencyKeys(client, settings.redis.key_prefix, settings.api.idempotency_ttl_s)
    quotas = Quotas.load(settings.policies_dir / "tenants.yaml", Slots(client, keys), settings.queue.max_depth)
    file_store.budget = quotas.keep  # uploads kept in Redis count against the tenant's storage budget
    sessions = Sessions(settings, SessionStore(client, keys, settings.retention_s), store, file_store, language_set,
                        policies, quotas, fleet)  # fmt: skip
    run_store = RunStore(client, keys, settings.retention_s)
    submissions = Submissions(
        settings=settings, store=store, files=file_store, queue=queue, policies=policies, languages=language_set,
        quotas=quotas, fleet=fleet, idempotency=idempotency, spans=spans,
        on_accept=lambda language: metrics.accepted.labels(language).inc(), sessions=sessions,
        gates=ExecutionGate(run_store),
    )  # fmt: skip
    library = Library(ScriptStore(client, keys), submissions, language_set, policies)
    schedule_store = ScheduleStore(client, keys)
    executor = Executor(run_store, submissions, artifacts, metrics.plans, library)
    allowed = lambda tenant: quotas.quota(tenant).policies  # noqa: E731
    plan_runs = Runs(executor, language_set, policies, allowed, settings.webhooks.allow_hosts)
    api_keys = ApiKeys(client, settings.redis.key_prefix)
    app.state.services = Services(
        settings=settings,
        store=store,
        executions=submissions,
        files=file_store,
        fleet=fleet,
        queue=queue,
        policies=policies,
        languages=language_set,
        artifacts=artifacts,
        metrics=metrics,
        registry=registry,
        spans=spans,
        idempotency=idempotency,
        keys=api_keys,
        quotas=quotas,
        waiters=waiters,
        runs=plan_runs,
        scripts=library,
        schedules=Scheduler(schedule_store, library, store, metrics.schedules, loop_metrics=metrics.loops),
        surprises=Surprises(client, keys, store, schedule_store, settings.retention_s),
        sessions=sessions,
        sandboxes=Sandboxes(settings.e2b, sessions, client, keys, settings.retention_s),
        interpreter=Interpreter(
            submissions,
            sessions,
            artifacts,
            waiters.streams,
            keys,
            int(settings.api.sse_keepalive_s * 1000),
            waiters,
            ContextBook(client, keys, settings.sessions.max_lifetime_s + settings.retention_s),
            settings.e2b.call_timeout_s,
        ),  # fmt: skip
        envd=Envd(sessions.store, waiters.streams, keys, settings.e2b.max_file_bytes, settings.e2b.call_timeout_s),
        watchers=WatcherBook(client, keys, settings.sessions.max_lifetime_s + settings.retention_s),
        console=SignIns(client, keys, api_keys),
        dead_letters=dead_letters,
    )
    foreign = {"/e2b/": e2b.error_response} if settings.e2b.enabled else {}
    problems.install(app, foreign)
    limits.install(app, settings.api, policies, app.state.foreign_shapes)
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
