"""What routes depend on, as Annotated aliases over the services built once in create_app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry
from rq import Queue

from execbox.artifact_store import ArtifactStore
from execbox.idempotency import IdempotencyKeys
from execbox.languages import Languages
from execbox.metrics import ApiMetrics
from execbox.policies import PolicySet
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


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]
