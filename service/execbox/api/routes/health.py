"""/healthz (the process answers) and /readyz (Redis, a worker with a reachable Docker engine, this process's loops)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from execbox.api.deps import FleetDep, RegistryDep, StoreDep
from execbox.core.errors import ServiceError
from execbox.core.poison import Loops

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
def metrics(registry: RegistryDep) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


_READY = {
    "description": "`status` and one entry per dependency in `checks` (redis, workers, docker, images), and "
    "`loops`: this process's background loops (plans, scheduler, surprises), each running or waiting to be "
    "restarted, with its restarts and last error."
}


@router.get(
    "/readyz",
    summary="Readiness: Redis answers, a live worker reaches its Docker engine and has the images, and this "
    "process's background loops run",
    responses={200: _READY, 503: _READY},
)
def readyz(store: StoreDep, fleet: FleetDep, request: Request) -> JSONResponse:
    checks: dict[str, Any] = {"loops": _loops(request)}
    try:
        store.ping()
        checks["redis"] = {"ok": True}
        workers = fleet.alive()
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
    ready = all(c["ok"] for c in checks.values()) and len(checks) == 5
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks}, status_code=200 if ready else 503
    )


def _loops(request: Request) -> dict[str, Any]:
    """Each background loop of this process: a loop that died is restarted by its supervisor, and
    until it runs again the process is not ready."""
    loops: Loops | None = getattr(request.app.state, "loops", None)
    states = loops.status() if loops is not None else {}
    down = sorted(name for name, state in states.items() if not state.running)
    return {
        "ok": not down,
        "detail": f"not running (restarting): {', '.join(down)}" if down else "every background loop runs",
        "loops": {name: {"running": state.running, "restarts": state.restarts, "last_error": state.last_error}
                  for name, state in states.items()},
    }  # fmt: skip
