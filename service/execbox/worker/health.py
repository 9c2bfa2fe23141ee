"""The worker's own HTTP server (EXECBOX_TELEMETRY__WORKER_METRICS_PORT): /metrics, and /readyz, 200 only
while Redis and the sandbox runtime (the engine, and the bubblewrap helper when one is configured)
answer within `CHECK_TIMEOUT_S`, 503 naming what does not otherwise. An orchestrator then routes no
work to, and restarts, a worker that can take none; the API's /readyz speaks for the service."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from execbox.core.errors import ServiceError
from execbox.core.stopping import left
from execbox.sandbox.errors import RuntimeUnavailable
from execbox.worker.context import WorkerContext

CHECK_TIMEOUT_S = 2.0
"""Longest /readyz waits for each dependency (all are asked at once)."""

Check = Callable[[], None]
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def checks(ctx: WorkerContext) -> dict[str, Check]:
    """What a worker needs to take work: each raises when it does not answer."""
    found: dict[str, Check] = {"redis": lambda: ctx.store.ping(), "engine": lambda: ctx.runtime.ping()}
    helper = ctx.settings.docker.bwrap_socket
    if helper:
        found["bwrap_helper"] = lambda: _connect(helper)
    return found


def readiness(named: dict[str, Check], timeout_s: float | None = None) -> tuple[bool, dict[str, Any]]:
    """(ready, one entry per check): every check runs at once in a daemon thread; one that has not
    answered by the timeout counts as down (a hung engine must not hang the probe)."""
    timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    answers: dict[str, dict[str, Any]] = {}

    def run(name: str, check: Check) -> None:
        try:
            check()
            answers[name] = {"ok": True}
        except ServiceError as exc:
            answers[name] = {"ok": False, "detail": exc.message}
        except Exception as exc:
            answers[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"[:300]}

    threads = [threading.Thread(target=run, args=item, name=f"readyz-{item[0]}", daemon=True) for item in named.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(left(deadline))
    result = {
        name: dict(answers.get(name) or {"ok": False, "detail": f"no answer within {timeout_s:g} s"}) for name in named
    }
    return all(entry["ok"] for entry in result.values()), result


def serve(ctx: WorkerContext, port: int, host: str) -> ThreadingWSGIServer:
    """Start the server in a daemon thread; the server, to stop it."""
    metrics = make_wsgi_app(ctx.registry)
    named = checks(ctx)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        ready, entries = readiness(named)
        body = json.dumps({"status": "ready" if ready else "not_ready", "checks": entries}).encode()
        status = "200 OK" if ready else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    family, *_, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class _Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(str(address[0]), port, app, _Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="worker-metrics", daemon=True).start()
    return httpd


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds: nothing to log."""


def _connect(path: str) -> None:
    """The bubblewrap helper accepts on its socket (a connection closed before its HEAD starts nothing;
    a stale socket file of a helper gone refuses it)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CHECK_TIMEOUT_S)
    try:
        conn.connect(path)
    except OSError as exc:
        raise RuntimeUnavailable(
            f"the bubblewrap helper does not answer on {path} ({exc}); start `execbox bwrap-helper`"
        ) from exc
    finally:
        conn.close()


__all__ = ["CHECK_TIMEOUT_S", "checks", "readiness", "serve"]
