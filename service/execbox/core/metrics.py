"""The metric mechanism: shared buckets, the background loops' metrics, and how processes export them.

Every metric is prefixed execbox_ and has bounded labels only. Each room defines its own metrics in
its `metrics.py` (a frozen dataclass of Prometheus objects and a function that registers them in a
given registry); an entry point builds its process's bundle from them (execbox.api.metrics, the
worker's execbox.executions.metrics.worker_metrics). The API and each worker process export their
own registry. Workers run jobs in-process (RQ SimpleWorker, no fork per job), so a worker records
into its own registry and serves it on its own port: no multiprocess mode is needed and nothing is
lost between jobs. Gauges that describe shared state (queue depth, running executions, live workers,
dead letters) are read from Redis when the API is scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60, 120, 300)


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


__all__ = ["DeadLetterCollector", "LATENCY_BUCKETS", "LoopMetrics", "loop_metrics"]
