"""Every Prometheus metric execbox exports, defined once (prefix execbox_, bounded labels only).

The API and each worker process export their own. Workers run jobs in-process (RQ SimpleWorker,
no fork per job), so a worker records into its own registry and serves it on its own port: no
multiprocess mode is needed and nothing is lost between jobs. Gauges that describe shared state
(queue depth, running executions, live workers) are read from Redis when the API is scraped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True)
class OutcomeMetrics:
    """Recorded by whichever process settles an execution (worker, or API/reaper for expiry and loss)."""

    finished: Counter
    end_to_end: Histogram

    def observe(self, status: str, category: str, language: str, seconds: float | None) -> None:
        """One execution ended: its status, error category ("none" on success), language and the
        seconds from acceptance to its end (None when unknown)."""
        self.finished.labels(status, category, language).inc()
        if seconds is not None:
            self.end_to_end.labels(language).observe(seconds)


def outcome_metrics(registry: CollectorRegistry) -> OutcomeMetrics:
    return OutcomeMetrics(
        finished=Counter("execbox_executions_total", "Executions finished, by status, error category ('none' on "
                         "success) and language", ["status", "category", "language"], registry=registry),
        end_to_end=Histogram("execbox_end_to_end_seconds", "From acceptance to the stored result", ["language"],
                             buckets=LATENCY_BUCKETS, registry=registry),
    )  # fmt: skip


@dataclass(frozen=True)
class PlanMetrics:
    """Recorded by the plan executor (in the API processes)."""

    runs: Counter
    steps: Counter
    replans: Counter
    approval_wait: Histogram


def plan_metrics(registry: CollectorRegistry) -> PlanMetrics:
    return PlanMetrics(
        runs=Counter("execbox_runs_total", "Runs that reached a terminal status, by status and stop reason",
                     ["status", "reason"], registry=registry),
        steps=Counter("execbox_run_steps_total", "Step status changes to a settled status (succeeded, failed, "
                      "upstream_failed, unknown_outcome, cancelled, superseded)", ["status"], registry=registry),
        replans=Counter("execbox_run_replans_total", "Revisions accepted for runs that needed a re-plan",
                        registry=registry),
        approval_wait=Histogram("execbox_approval_wait_seconds", "From an approval's request to its decision",
                                buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 86400), registry=registry),
    )  # fmt: skip


@dataclass(frozen=True)
class ScheduleMetrics:
    firings: Counter
    lag: Histogram


def schedule_metrics(registry: CollectorRegistry) -> ScheduleMetrics:
    return ScheduleMetrics(
        firings=Counter("execbox_schedule_firings_total", "Schedule slots handled, by outcome (fired, queued, "
                        "skipped_overlap, skipped_misfire, not_started)", ["status"], registry=registry),
        lag=Histogram("execbox_schedule_lag_seconds", "From a slot's time to its execution's acceptance",
                      buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300), registry=registry),
    )  # fmt: skip


@dataclass(frozen=True)
class LoopMetrics:
    """Recorded by every process's background loops (execbox.core.poison)."""

    poison: Counter
    dead_letters: Counter
    restarts: Counter

    def initialise(self, loops: Iterable[str]) -> None:
        for loop in loops:  # at zero from the start, so rates and alerts have a series
            self.poison.labels(loop)
            self.dead_letters.labels(loop)
            self.restarts.labels(loop)


def loop_metrics(registry: CollectorRegistry) -> LoopMetrics:
    return LoopMetrics(
        poison=Counter("execbox_poison_total", "Failures handling one message or record of a background loop "
                       "(each retried with backoff, then set aside as a dead letter)", ["loop"], registry=registry),
        dead_letters=Counter("execbox_dead_letters_total", "Messages or records a loop set aside as dead letters "
                             "after their last attempt (`execbox dead-letters list`)", ["loop"], registry=registry),
        restarts=Counter("execbox_loop_restarts_total", "Background loops restarted by their supervisor after "
                         "dying (expected: never)", ["loop"], registry=registry),
    )  # fmt: skip


class DeadLetterCollector(Collector):
    """Dead letters waiting per loop, read from Redis at scrape time (what the alert watches)."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            counts = self._read()
        except Exception:  # Redis down: export nothing rather than zeros that look true
            return
        family = GaugeMetricFamily("execbox_dead_letters", "Dead letters waiting for an operator, per loop "
                                   "(`execbox dead-letters list`)", labels=["loop"])  # fmt: skip
        for loop, count in counts.items():
            family.add_metric([loop], float(count))
        yield family


@dataclass(frozen=True)
class ApiMetrics:
    requests: Counter
    request_seconds: Histogram
    accepted: Counter
    outcomes: OutcomeMetrics
    plans: PlanMetrics
    schedules: ScheduleMetrics
    loops: LoopMetrics


def api_metrics(registry: CollectorRegistry) -> ApiMetrics:
    return ApiMetrics(
        outcomes=outcome_metrics(registry),
        plans=plan_metrics(registry),
        schedules=schedule_metrics(registry),
        loops=loop_metrics(registry),
        requests=Counter("execbox_api_requests_total", "HTTP requests by route template, method and status code",
                         ["route", "method", "code"], registry=registry),
        request_seconds=Histogram("execbox_api_request_duration_seconds", "HTTP request latency by route template",
                                  ["route", "method"], buckets=LATENCY_BUCKETS, registry=registry),
        accepted=Counter("execbox_executions_accepted_total", "Executions accepted into the queue, by language",
                         ["language"], registry=registry),
    )  # fmt: skip


@dataclass(frozen=True)
class WorkerMetrics:
    outcomes: OutcomeMetrics
    queue_wait: Histogram
    sandbox_start: Histogram
    run: Histogram
    sandbox_starts: Counter
    sandbox_failures: Counter
    oom_kills: Counter
    output_bytes: Counter
    artifact_bytes: Counter
    running: Gauge
    pool_takes: Counter
    pool_refill: Histogram
    pool_target: Gauge
    status_mismatches: Counter
    network_denials: Counter
    jobs_refused: Counter
    loops: LoopMetrics

    def initialise(self, languages: Iterable[str], failure_reasons: Iterable[str]) -> None:
        """Export every labelled series the dashboard charts from the start, at zero: a counter that
        has not happened yet reads 0, not "no data" (a rate over a missing series is empty)."""
        names = list(languages)
        for language in names:
            self.oom_kills.labels(language)
        self.initialise_pool(names)  # a worker without a pool aims at none and takes none
        for reason in failure_reasons:
            self.sandbox_failures.labels(reason)
        for stream in ("stdout", "stderr"):
            self.output_bytes.labels(stream)

    def initialise_pool(self, classes: Iterable[str]) -> None:
        """The pool's series per class (its `language` label holds the class name), at zero."""
        for name in classes:
            self.pool_refill.labels(name)
            self.pool_target.labels(name)
            for result in ("hit", "miss"):
                self.pool_takes.labels(name, result)


def worker_metrics(registry: CollectorRegistry) -> WorkerMetrics:
    def seconds(name: str, what: str) -> Histogram:
        return Histogram(name, what, ["language"], buckets=LATENCY_BUCKETS, registry=registry)

    return WorkerMetrics(
        outcomes=outcome_metrics(registry),
        loops=loop_metrics(registry),
        queue_wait=seconds("execbox_queue_wait_seconds", "From acceptance to a worker taking the execution"),
        sandbox_start=seconds("execbox_sandbox_start_seconds", "Creating and starting the sandbox container"),
        run=seconds("execbox_run_seconds", "From program start to its end"),
        sandbox_starts=Counter("execbox_sandbox_starts_total", "Sandbox runs attempted", registry=registry),
        sandbox_failures=Counter("execbox_sandbox_failures_total", "Sandbox runs that failed for the service's own "
                                 "reasons (engine, image, worker)", ["reason"], registry=registry),
        oom_kills=Counter("execbox_oom_kills_total", "Sandboxes the engine reported OOM-killed", ["language"],
                          registry=registry),
        output_bytes=Counter("execbox_output_bytes_total", "Bytes of stdout/stderr returned", ["stream"],
                             registry=registry),
        artifact_bytes=Counter("execbox_artifact_bytes_total", "Bytes of artifacts kept", registry=registry),
        running=Gauge("execbox_worker_busy", "Executions this worker process runs now (one-shot runs and "
                      "session calls)", registry=registry),
        pool_takes=Counter("execbox_pool_takes_total", "Runs that fit a warm-pool class (the `language` label: the "
                           "class, e.g. python, python@slim, python:strict), by whether a warm container was ready "
                           "(hit) or the run started cold (miss)", ["language", "result"],
                           registry=registry),
        pool_refill=seconds("execbox_pool_refill_seconds", "Creating and starting one warm-pool container"),
        pool_target=Gauge("execbox_pool_target", "Warm containers this worker aims to keep per pool class (its recent "
                          "arrivals within the class's min and max and the memory budget)", ["language"],
                          registry=registry),
        status_mismatches=Counter("execbox_sandbox_status_mismatches_total", "Runs whose launcher-reported exit "
                                  "status or OOM flag the engine contradicted afterwards (expected: never)",
                                  registry=registry),
        network_denials=Counter("execbox_network_denials_total", "Connections the egress proxy refused, counted "
                                "when their execution finishes", registry=registry),
        jobs_refused=Counter("execbox_jobs_refused_total", "Queue messages a worker refused to run because they "
                             "named a function, instance, callback or webhook that is not execbox's own "
                             "(expected: never; someone wrote to the queue)", ["reason"], registry=registry),
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
