"""The engine seam: docker SDK failures as the service's errors, and the engine's listings of what a
deployment made (containers and networks, by their labels) for the reaper and the warm pool."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from execbox.sandbox.errors import ImageUnavailable, RuntimeUnavailable
from execbox.sandbox.runtime import (
    DEPLOYMENT_LABEL,
    EXECUTION_LABEL,
    MANAGED_LABEL,
    POOL_LABEL,
    POOL_MEMORY_LABEL,
    SESSION_LABEL,
    WORKER_LABEL,
    ContainerInfo,
)


@contextmanager
def docker_errors() -> Iterator[None]:
    try:
        yield
    except ImageNotFound as exc:
        raise ImageUnavailable(
            f"sandbox image missing on this worker's engine ({exc.explanation}); build it with `make images`"
        ) from exc
    except (DockerException, requests.RequestException) as exc:
        raise RuntimeUnavailable(f"Docker engine unreachable or failing ({exc}); retry shortly") from exc


def unix_time(created: str) -> float:
    """The engine's RFC 3339 time (nanoseconds, Z or offset) as Unix time; 0 when unreadable."""
    try:
        stamp = re.sub(r"(\.\d{6})\d+", r"\1", created).replace("Z", "+00:00")
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def _labels(deployment: str) -> dict[str, list[str]]:
    return {"label": [f"{MANAGED_LABEL}=true", f"{DEPLOYMENT_LABEL}={deployment}"]}


def listed_containers(api: docker.APIClient, deployment: str) -> list[ContainerInfo]:
    with docker_errors():
        found = api.containers(all=True, filters=_labels(deployment))
    return [
        ContainerInfo(
            id=c["Id"],
            execution_id=(c.get("Labels") or {}).get(EXECUTION_LABEL),
            created_at=float(c.get("Created", 0)),
            running=c.get("State") == "running",
            worker=(c.get("Labels") or {}).get(WORKER_LABEL),
            pool=(c.get("Labels") or {}).get(POOL_LABEL),
            session=(c.get("Labels") or {}).get(SESSION_LABEL),
            pool_memory_mb=int((c.get("Labels") or {}).get(POOL_MEMORY_LABEL) or 0),
        )
        for c in found
    ]


def listed_networks(api: docker.APIClient, deployment: str) -> list[ContainerInfo]:
    with docker_errors():
        found = api.networks(filters=_labels(deployment))
    return [
        ContainerInfo(
            id=n["Id"],
            execution_id=(n.get("Labels") or {}).get(EXECUTION_LABEL),
            created_at=unix_time(n.get("Created", "")),
            running=False,
        )
        for n in found
    ]
