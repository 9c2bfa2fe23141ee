"""The API process's metrics: its HTTP requests, the rooms' metrics it records, and the gauges of
shared state it reads from Redis at each scrape (so every replica reports the same truth)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from execbox.assembly import RoomMetrics
from execbox.core.metrics import LATENCY_BUCKETS


@dataclass(frozen=True)
class ApiMetrics:
    requests: Counter
    request_seconds: Histogram
    rooms: RoomMetrics
    """The rooms' metrics, built with the control plane (execbox.assembly)."""


def api_metrics(registry: CollectorRegistry, rooms: RoomMetrics) -> ApiMetrics:
    """The rooms' metrics and the API's own HTTP metrics."""
    return ApiMetrics(
        requests=Counter("execbox_api_requests_total", "HTTP requests by route template, method and status code",
                         ["route", "method", "code"], registry=registry),
        request_seconds=Histogram("execbox_api_request_duration_seconds", "HTTP request latency by route template",
                                  ["route", "method"], buckets=LATENCY_BUCKETS, registry=registry),
        rooms=rooms,
    )  # fmt: skip


class SharedStateCollector(Collector):
    """Gauges read from Redis at scrape time, so every API replica reports the same truth."""

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            values = self._read()
        except Exception:  # Redis down: export nothing rather than zeros that look true
            return
        for name, help_text in (
            ("execbox_queue_depth", "Executions waiting in the queue"),
            ("execbox_executions_running", "Executions running now"),
            ("execbox_workers_alive", "Workers that reported within the last three reaper intervals"),
            ("execbox_workers_docker_ok", "Live workers whose Docker engine answers"),
            ("execbox_warm_pool_size", "Warm sandboxes waiting in live workers' pools (as of their last heartbeat)"),
            ("execbox_redis_memory_used_bytes", "Memory Redis uses for data"),
            (
                "execbox_redis_memory_max_bytes",
                "Redis's maxmemory (0: no limit); at it, writes are refused (noeviction)",
            ),
        ):
            family = GaugeMetricFamily(name, help_text)
            family.add_metric([], values.get(name, 0.0))
            yield family


class HttpMetrics:
    """ASGI middleware: requests by route template (never the raw path), method and status code."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # the application's live route list
        self._flattened: list[BaseRoute] | None = None

    def _flat(self) -> list[BaseRoute]:
        if self._flattened is None:  # routes are fixed once the app serves; flatten included routers once
            flat: list[BaseRoute] = []
            pending = list(self.routes)
            while pending:
                route = pending.pop(0)
                inner = getattr(route, "original_router", None)
                if inner is not None:
                    pending[:0] = list(inner.routes)
                else:
                    flat.append(route)
            self._flattened = flat
        return self._flattened

    def _template(self, scope: Scope) -> str:
        partial = None
        for route in self._flat():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return str(getattr(route, "path", "unmatched"))
            if match is Match.PARTIAL and partial is None:
                partial = str(getattr(route, "path", "unmatched"))
        return partial or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = self._template(scope)
            method = scope["method"]
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.request_seconds.labels(route, method).observe(time.perf_counter() - start)


__all__ = ["ApiMetrics", "HttpMetrics", "SharedStateCollector", "api_metrics"]
