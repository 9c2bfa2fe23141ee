"""What routes depend on, as Annotated aliases over the services built once in create_app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from prometheus_client import CollectorRegistry
from rq import Queue

from execbox.api.waits import Waiters
from execbox.artifact_store import ArtifactStore
from execbox.auth import DEFAULT_TENANT, ApiKeys
from execbox.idempotency import IdempotencyKeys
from execbox.languages import Languages
from execbox.metrics import ApiMetrics
from execbox.policies import PolicySet
from execbox.quotas import Quotas
from execbox.settings import Settings
from execbox.store import ExecutionStore, redis_errors
from execbox.tracing import Spans


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: ExecutionStore
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


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _services_dep(request: Request) -> Services:
    """Async, so that FastAPI resolves it on the event loop rather than in a worker thread."""
    return _services(request)


ServicesDep = Annotated[Services, Depends(_services_dep)]


async def _tenant(
    request: Request, authorization: Annotated[str | None, Header(description="`Bearer <API key>`")] = None
) -> str:
    """On the event loop (one async Redis GET): authentication never waits for a thread."""
    services = _services(request)
    if not services.settings.auth.enabled:
        return DEFAULT_TENANT
    redis_key = services.keys.lookup_key(authorization)
    with redis_errors():
        raw = await services.waiters.redis.get(redis_key)
    return services.keys.tenant_from(raw)


TenantDep = Annotated[str, Depends(_tenant)]
"""The calling tenant, from its API key (401 without a valid one)."""
