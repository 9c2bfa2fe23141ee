"""What routes depend on, as Annotated aliases over the services built once in create_app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from prometheus_client import CollectorRegistry
from rq import Queue

from execbox.artifact_store import ArtifactStore
from execbox.auth import DEFAULT_TENANT, ApiKeys
from execbox.idempotency import IdempotencyKeys
from execbox.languages import Languages
from execbox.metrics import ApiMetrics
from execbox.policies import PolicySet
from execbox.quotas import Quotas
from execbox.settings import Settings
from execbox.store import ExecutionStore
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


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]


def _tenant(
    request: Request, authorization: Annotated[str | None, Header(description="`Bearer <API key>`")] = None
) -> str:
    services = _services(request)
    if not services.settings.auth.enabled:
        return DEFAULT_TENANT
    return services.keys.tenant_of(authorization)


TenantDep = Annotated[str, Depends(_tenant)]
"""The calling tenant, from its API key (401 without a valid one)."""
