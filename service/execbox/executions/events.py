"""What happens when an execution ends, wired in one place.

Two kinds of consumer hear of a terminal status change:

- in-process listeners, called by the process that made the change, right after its commit:
  outcome metrics (counted once, by whichever process settles the execution: a worker, or the
  API and the reaper for cancellations, expiries and lost workers);
- durable consumers, which read the outbox stream (`ExecutionStore.events`, written in the status
  change's own transaction) as a consumer group, so that nothing is missed when a process dies:
  webhook delivery (group `webhooks`, execbox.webhooks.delivery, in workers) and the plan
  executor (group `plans`, execbox.plans.consumer, in API processes); schedules join the same way.

Every process that changes statuses calls `subscribe` once, after building its store.
"""

from __future__ import annotations

from execbox.executions.metrics import OutcomeMetrics
from execbox.executions.record import ExecutionRecord
from execbox.executions.store import ExecutionStore

DURABLE_GROUPS = ("webhooks", "plans", "surprises")
"""Consumer groups reading the outbox stream."""


def subscribe(store: ExecutionStore, outcomes: OutcomeMetrics) -> None:
    def count(record: ExecutionRecord) -> None:
        category = record.error.category.value if record.error else "none"
        seconds = None if record.finished_at is None else max(record.finished_at - record.created_at, 0.0)
        outcomes.observe(record.status.value, category, record.language, seconds)

    store.listeners.append(count)
