"""/healthz (the process answers) and /readyz (Redis and a worker with a reachable Docker engine)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from execbox.api.deps import ServicesDep
from execbox.errors import ServiceError

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the API process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: Redis answers and a live worker reaches its Docker engine")
def readyz(services: ServicesDep) -> JSONResponse:
    checks: dict[str, Any] = {}
    try:
        services.store.ping()
        checks["redis"] = {"ok": True}
        workers = services.store.workers()
        docker_ok = [w for w in workers if w.get("docker_ok")]
        checks["workers"] = {"ok": bool(workers), "alive": len(workers)}
        checks["docker"] = {
            "ok": bool(docker_ok),
            "detail": "reachable from a worker"
            if docker_ok
            else ("; ".join(str(w.get("detail")) for w in workers) or "no worker has reported"),
        }
    except ServiceError as exc:
        checks["redis"] = {"ok": False, "detail": exc.message}
    ready = all(c["ok"] for c in checks.values()) and len(checks) == 3
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks}, status_code=200 if ready else 503
    )
