"""What routes depend on, as Annotated aliases over the services built once in create_app."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from prometheus_client import CollectorRegistry
from rq import Queue

from execbox.api.metrics import ApiMetrics
from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.core.deadletters import DeadLetters
from execbox.core.redis import redis_errors
from execbox.core.tracing import Spans
from execbox.e2b.envd import Envd
from execbox.e2b.interpreter import Interpreter
from execbox.e2b.sandboxes import Sandboxes
from execbox.e2b.watchers import WatcherBook
from execbox.executions.idempotency import IdempotencyKeys
from execbox.executions.store import ExecutionStore
from execbox.executions.submit import Submissions
from execbox.executions.waits import Waiters
from execbox.files.blobs import ArtifactStore
from execbox.files.store import FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.library.service import Library
from execbox.plans.runs import Runs
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.surprises import Surprises
from execbox.sessions.service import Sessions
from execbox.settings import Settings
from execbox.tenancy.apikeys import DEFAULT_TENANT, ApiKeys, KeyInfo
from execbox.tenancy.errors import UngatedRoute
from execbox.tenancy.quotas import Quotas
from execbox.tenancy.signins import SignIns


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: ExecutionStore
    executions: Submissions
    files: FileStore
    fleet: WorkerRegistry
    queue: Queue
    policies: PolicySet
    languages: Languages
    artifacts: ArtifactStore
    metrics: ApiMetrics
    registry: CollectorRegistry
    spans: Spans
    idempotency: IdempotencyKeys
    keys: ApiKeys
    quotas: Quotas
    waiters: Waiters
    runs: Runs
    scripts: Library
    schedules: Scheduler
    surprises: Surprises
    sessions: Sessions
    sandboxes: Sandboxes
    interpreter: Interpreter
    envd: Envd
    watchers: WatcherBook
    console: SignIns
    dead_letters: DeadLetters


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def _part(field: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency on one of the deployment's services: each route names the ones it uses, never
    the whole bag. Async, so that FastAPI resolves it on the event loop, not in a worker thread."""
    if field not in Services.__dataclass_fields__:
        raise AttributeError(f"Services has no {field!r}")  # at import, not at a request

    async def part(request: Request) -> Any:
        return getattr(_services(request), field)

    part.__name__ = part.__qualname__ = f"services_{field}"
    return part


SettingsDep = Annotated[Settings, Depends(_part("settings"))]
StoreDep = Annotated[ExecutionStore, Depends(_part("store"))]
SubmissionsDep = Annotated[Submissions, Depends(_part("executions"))]
FilesDep = Annotated[FileStore, Depends(_part("files"))]
FleetDep = Annotated[WorkerRegistry, Depends(_part("fleet"))]
QueueDep = Annotated[Queue, Depends(_part("queue"))]
PoliciesDep = Annotated[PolicySet, Depends(_part("policies"))]
LanguagesDep = Annotated[Languages, Depends(_part("languages"))]
ArtifactsDep = Annotated[ArtifactStore, Depends(_part("artifacts"))]
MetricsDep = Annotated[ApiMetrics, Depends(_part("metrics"))]
RegistryDep = Annotated[CollectorRegistry, Depends(_part("registry"))]
SpansDep = Annotated[Spans, Depends(_part("spans"))]
IdempotencyDep = Annotated[IdempotencyKeys, Depends(_part("idempotency"))]
KeysDep = Annotated[ApiKeys, Depends(_part("keys"))]
QuotasDep = Annotated[Quotas, Depends(_part("quotas"))]
WaitersDep = Annotated[Waiters, Depends(_part("waiters"))]
RunsDep = Annotated[Runs, Depends(_part("runs"))]
LibraryDep = Annotated[Library, Depends(_part("scripts"))]
SchedulerDep = Annotated[Scheduler, Depends(_part("schedules"))]
SurprisesDep = Annotated[Surprises, Depends(_part("surprises"))]
SessionsDep = Annotated[Sessions, Depends(_part("sessions"))]
SandboxesDep = Annotated[Sandboxes, Depends(_part("sandboxes"))]
InterpreterDep = Annotated[Interpreter, Depends(_part("interpreter"))]
EnvdDep = Annotated[Envd, Depends(_part("envd"))]
WatchersDep = Annotated[WatcherBook, Depends(_part("watchers"))]
SignInsDep = Annotated[SignIns, Depends(_part("console"))]
DeadLettersDep = Annotated[DeadLetters, Depends(_part("dead_letters"))]


@dataclass(frozen=True)
class KeyCheck:
    """Who an API key is, asked on the event loop (one async Redis GET): authentication never waits
    for a thread. Built per request from the three parts it needs."""

    enabled: bool
    keys: ApiKeys
    waiters: Waiters

    async def info(self, authorization: str | None) -> KeyInfo | None:
        """The key's record (401 for a key the service does not know); None when auth is off."""
        if not self.enabled:
            return None
        redis_key = self.keys.lookup_key(authorization)
        with redis_errors():
            raw = await self.waiters.redis.get(redis_key)
        return self.keys.key_from(raw)


async def _key_check(settings: SettingsDep, keys: KeysDep, waiters: WaitersDep) -> KeyCheck:
    return KeyCheck(settings.auth.enabled, keys, waiters)


KeyCheckDep = Annotated[KeyCheck, Depends(_key_check)]


async def _tenant(
    request: Request,
    check: KeyCheckDep,
    authorization: Annotated[str | None, Header(description="`Bearer <API key>`")] = None,
) -> str:
    info = await check.info(authorization)
    if info is None:
        return DEFAULT_TENANT
    request.state.api_key_id = info.key_id  # who is calling, within the tenant (approvals name keys)
    request.state.api_key_gated = info.require_approval  # its writes wait for another key's approval
    if info.require_approval and request.method in ("POST", "PATCH", "PUT"):
        ungated = next((what for pattern, what in _UNGATED if pattern.match(request.url.path)), None)
        if ungated is not None:
            raise UngatedRoute(ungated)
    return info.tenant


_UNGATED = (
    (re.compile(r"^/v1/scripts/[^/]+/invoke$"), "a script's invocation"),
    (re.compile(r"^/v1/schedules(/[^/]+(/resume)?)?$"), "a schedule"),
)
"""Routes that run code without an approval on the way (a schedule fires later, unattended), refused to
a key whose writes need approval; deleting or pausing a schedule stays allowed."""


TenantDep = Annotated[str, Depends(_tenant)]
"""The calling tenant, from its API key (401 without a valid one)."""
