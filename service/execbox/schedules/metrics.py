"""The schedules room's metrics, recorded by the scheduler (in the API processes)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram


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


__all__ = ["ScheduleMetrics", "schedule_metrics"]
