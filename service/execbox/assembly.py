"""The deployment's objects, built once from Settings. `foundation` is what every process stands on
(the Redis client and keys, the execution store, artifact and file stores, the fleet, the language
and policy catalogues): a worker's context (`execbox.worker.context`) adds its sandbox runtime and
its own metrics to it. `assemble` adds the control plane: what `execbox api` serves, what `execbox
scheduler` runs without serving anything, and what the in-process tests stand on.

Nothing here is HTTP's (the app, its middleware and routes, the async wait channel, the E2B facade's
readers: `execbox.api` builds those around a ControlPlane) or the sandbox's (the runtime and the
warm pool are the worker's). The import rule keeps it so: the API, which must never reach the
sandbox, imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
from prometheus_client import CollectorRegistry, Counter
from rq import Queue

from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.core.deadletters import DeadLetters
from execbox.core.metrics import LoopMetrics, loop_metrics
from execbox.core.redis import connect
from execbox.core.tracing import Spans
from execbox.core.tracing import setup as setup_tracing
from execbox.executions import events
from execbox.executions.idempotency import IdempotencyKeys
from execbox.executions.metrics import OutcomeMetrics, outcome_metrics
from execbox.executions.queue import make_queue
from execbox.executions.store import ExecutionStore
from execbox.executions.submit import Submissions
from execbox.files.backend import input_blobs, open_store
from execbox.files.blobs import ArtifactStore
from execbox.files.store import FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.keyschema import LOOPS, Keys
from execbox.library.service import Library
from execbox.library.store import ScriptStore
from execbox.plans.approvals import ExecutionGate
from execbox.plans.executor import Executor
from execbox.plans.metrics import PlanMetrics, plan_metrics
from execbox.plans.runs import Runs
from execbox.plans.store import RunStore
from execbox.schedules.metrics import ScheduleMetrics, schedule_metrics
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.store import ScheduleStore
from execbox.schedules.surprises import Surprises
from execbox.sessions.service import Sessions
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.quotas import Quotas, Slots

__all__ = ["ControlPlane", "Foundation", "RoomMetrics", "assemble", "foundation"]


@dataclass(frozen=True)
class Foundation:
    """What every process of a deployment builds the same way from its settings."""

    settings: Settings
    redis: redis.Redis
    keys: Keys
    store: ExecutionStore
    artifacts: ArtifactStore
    files: FileStore
    fleet: WorkerRegistry
    languages: Languages
    policies: PolicySet


def foundation(settings: Settings) -> Foundation:
    client = connect(settings)
    keys = Keys(settings.redis.key_prefix)
    artifacts = open_store(settings.artifacts, settings.artifacts_dir)  # input files' data goes beside
    return Foundation(
        settings=settings,
        redis=client,
        keys=keys,
        store=ExecutionStore(client, settings),
        artifacts=artifacts,
        files=FileStore(client, keys, input_blobs(artifacts, settings.redis.key_prefix)),
        fleet=WorkerRegistry(client, keys),
        languages=Languages.load(settings.images_dir),
        policies=PolicySet.load(settings.policies_dir),
    )


@dataclass(frozen=True)
class RoomMetrics:
    """The metrics the rooms record into, whoever exports them (the API's /metrics)."""

    outcomes: OutcomeMetrics
    plans: PlanMetrics
    schedules: ScheduleMetrics
    loops: LoopMetrics
    accepted: Counter


def room_metrics(registry: CollectorRegistry) -> RoomMetrics:
    return RoomMetrics(
        outcomes=outcome_metrics(registry),
        plans=plan_metrics(registry),
        schedules=schedule_metrics(registry),
        loops=loop_metrics(registry),
        accepted=Counter("execbox_executions_accepted_total", "Executions accepted into the queue, by language",
                         ["language"], registry=registry),
    )  # fmt: skip


@dataclass(frozen=True)
class ControlPlane:
    """One process's control-plane objects, each built once and shared by whatever uses it."""

    settings: Settings
    redis: redis.Redis
    keys: Keys
    metrics: RoomMetrics
    store: ExecutionStore
    queue: Queue
    fleet: WorkerRegistry
    dead_letters: DeadLetters
    artifacts: ArtifactStore
    files: FileStore
    policies: PolicySet
    languages: Languages
    spans: Spans
    idempotency: IdempotencyKeys
    api_keys: ApiKeys
    quotas: Quotas
    sessions: Sessions
    executions: Submissions
    scripts: Library
    runs: Runs
    schedules: Scheduler
    surprises: Surprises

    def close(self) -> None:
        self.redis.close()


def assemble(settings: Settings, registry: CollectorRegistry, component: str = "api") -> ControlPlane:
    """The control plane of `settings`, its metrics registered in `registry`; `component` names the
    process in its traces (execbox-api, execbox-scheduler)."""
    base = foundation(settings)
    client, keys, store, artifacts, files = base.redis, base.keys, base.store, base.artifacts, base.files
    policies, languages, fleet = base.policies, base.languages, base.fleet
    metrics = room_metrics(registry)
    events.subscribe(store, metrics.outcomes)
    queue = make_queue(client, settings)
    quotas = Quotas.load(settings.policies_dir / "tenants.yaml", Slots(client, keys), settings.queue.max_depth)
    files.budget = quotas.keep  # uploads kept in Redis count against the tenant's storage budget
    spans = setup_tracing(settings.telemetry.otlp_endpoint, f"execbox-{component}")
    idempotency = IdempotencyKeys(client, settings.redis.key_prefix, settings.api.idempotency_ttl_s)
    sessions = Sessions(settings, SessionStore(client, keys, settings.retention_s), store, files, languages,
                        policies, quotas, fleet)  # fmt: skip
    run_store = RunStore(client, keys, settings.retention_s)
    accepted: Callable[[str], None] = lambda language: metrics.accepted.labels(language).inc()  # noqa: E731
    submissions = Submissions(
        settings=settings, store=store, files=files, queue=queue, policies=policies, languages=languages,
        quotas=quotas, fleet=fleet, idempotency=idempotency, spans=spans, on_accept=accepted, sessions=sessions,
        gates=ExecutionGate(run_store),
    )  # fmt: skip
    library = Library(ScriptStore(client, keys), submissions, languages, policies)
    schedule_store = ScheduleStore(client, keys)
    executor = Executor(run_store, submissions, artifacts, metrics.plans, library)
    allowed = lambda tenant: quotas.quota(tenant).policies  # noqa: E731
    return ControlPlane(
        settings=settings,
        redis=client,
        keys=keys,
        metrics=metrics,
        store=store,
        queue=queue,
        fleet=fleet,
        dead_letters=DeadLetters(client, keys, LOOPS),
        artifacts=artifacts,
        files=files,
        policies=policies,
        languages=languages,
        spans=spans,
        idempotency=idempotency,
        api_keys=ApiKeys(client, settings.redis.key_prefix),
        quotas=quotas,
        sessions=sessions,
        executions=submissions,
        scripts=library,
        runs=Runs(executor, languages, policies, allowed, settings.webhooks.allow_hosts),
        schedules=Scheduler(schedule_store, library, store, metrics.schedules, loop_metrics=metrics.loops),
        surprises=Surprises(client, keys, store, schedule_store, settings.retention_s),
    )
