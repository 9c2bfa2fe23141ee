"""The metrics of an execution's life: its outcome (recorded by whichever process settles it) and its
run in a worker (queue wait, sandbox start, run time, output, the warm pool, refusals)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from execbox.core.metrics import LATENCY_BUCKETS, LoopMetrics, loop_metrics


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


__all__ = ["OutcomeMetrics", "WorkerMetrics", "outcome_metrics", "worker_metrics"]
