"""/healthz (the process answers) and /readyz (Redis and a worker with a reachable Docker engine)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from execbox.api.deps import ServicesDep
from execbox.core.errors import ServiceError

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the API process answers")
async def healthz() -> dict[str, str]:  # on the event loop: never queued behind the thread pool
    return {"status": "ok"}


@router.get(
    "/metrics",
    summary="Prometheus metrics of this API process and the shared queue state",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}},
)
def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.registry), media_type=CONTENT_TYPE_LATEST)


_READY = {"description": "`status` and one entry per dependency in `checks` (redis, workers, docker, images)."}


@router.get(
    "/readyz",
    summary="Readiness: Redis answers and a live worker reaches its Docker engine and has the images",
    responses={200: _READY, 503: _READY},
)
def readyz(services: ServicesDep) -> JSONResponse:
    checks: dict[str, Any] = {}
    try:
        services.store.ping()
        checks["redis"] = {"ok": True}
        workers = services.fleet.alive()
        docker_ok = [w for w in workers if w.docker_ok]
        checks["workers"] = {"ok": bool(workers), "alive": len(workers)}
        checks["docker"] = {
            "ok": bool(docker_ok),
            "detail": "reachable from a worker"
            if docker_ok
            else ("; ".join(w.detail for w in workers) or "no worker has reported"),
        }
        complete = [w for w in docker_ok if not w.missing_images]
        missing = sorted({image for w in docker_ok for image in w.missing_images})
        checks["images"] = {
            "ok": bool(complete),
            "detail": "every sandbox image present on a worker's engine"
            if complete
            else f"missing on every worker: {', '.join(missing) or 'no worker reaches Docker'}; run `make images`",
        }
    except ServiceError as exc:
        checks["redis"] = {"ok": False, "detail": exc.message}
    ready = all(c["ok"] for c in checks.values()) and len(checks) == 4
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks}, status_code=200 if ready else 503
    )
