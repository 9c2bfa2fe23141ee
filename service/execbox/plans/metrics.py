"""The plans room's metrics, recorded by the plan executor (in the API processes)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram


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


__all__ = ["PlanMetrics", "plan_metrics"]
