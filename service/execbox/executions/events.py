"""What happens when an execution ends, wired in one place.

Two kinds of consumer hear of a terminal status change:

- in-process listeners, called by the process that made the change, right after its commit:
  outcome metrics (counted once, by whichever process settles the execution: a worker, or the
  API and the reaper for cancellations, expiries and lost workers);
- durable consumers, which read the outbox stream (`ExecutionStore.events`, written in the status
  change's own transaction) as a consumer group, so that nothing is missed when a process dies:
  webhook delivery (execbox.webhooks.delivery, in workers), the plan executor
  (execbox.plans.consumer, in API processes) and surprise events (execbox.schedules.surprises, in
  API processes), each under the group name `consumer_group` gives it.

Every process that changes statuses calls `subscribe` once, after building its store.
"""

from __future__ import annotations

from execbox.executions.metrics import OutcomeMetrics
from execbox.executions.record import ExecutionRecord
from execbox.executions.store import ExecutionStore


def consumer_group(consumer: str, queue: str | None = None) -> str:
    """The consumer group a room's durable consumer reads the outbox stream as: its loop's name
    (declared in the room's keys.py, `LOOPS`), one group for every deployment on the Redis so that
    each event is handled once (`webhooks`, `surprises`); or, for a consumer each deployment runs for
    its own queue, with the queue (`plans.<queue>`: a run is advanced by its queue's API processes).
    Redis keeps each group's place in the stream under this name, so a name that changed would make
    a running stack's consumer start over (or skip) unless the group were moved too
    (execbox.core.keymigration)."""
    return consumer if queue is None else f"{consumer}.{queue}"


def subscribe(store: ExecutionStore, outcomes: OutcomeMetrics) -> None:
    def count(record: ExecutionRecord) -> None:
        category = record.error.category.value if record.error else "none"
        seconds = None if record.finished_at is None else max(record.finished_at - record.created_at, 0.0)
        outcomes.observe(record.status.value, category, record.language, seconds)

    store.listeners.append(count)
