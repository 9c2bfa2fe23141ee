"""The job queue (RQ on Redis): the only API-side module that imports rq.

Jobs carry only the execution id and the trace context; the record in the store is the single
source of truth, so a job that outlives its execution's deadline or cancellation does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from execbox.models import ExecutionRecord
from execbox.settings import Settings
from execbox.store import redis_errors

TASK = "execbox.worker.tasks.run_execution"
WEBHOOK_TASK = "execbox.worker.webhooks.deliver"


def make_queue(client: redis.Redis, settings: Settings) -> Queue:
    return Queue(settings.queue.name, connection=client, serializer=JSONSerializer)


def make_webhook_queue(client: redis.Redis, settings: Settings) -> Queue:
    """Webhook deliveries: workers take them when no execution waits."""
    return Queue(f"{settings.queue.name}-webhooks", connection=client, serializer=JSONSerializer)


def enqueue_webhook(queue: Queue, execution_id: str, settings: Settings) -> None:
    hooks = settings.webhooks
    budget = hooks.max_attempts * hooks.timeout_s + 1.5 * hooks.backoff_s * 2**hooks.max_attempts
    with redis_errors():
        queue.enqueue_call(
            WEBHOOK_TASK,
            args=({"execution_id": execution_id},),
            job_id=f"webhook-{execution_id}",
            timeout=int(min(budget + 30, 3600)),
            result_ttl=60,
            failure_ttl=settings.retention_s,
        )


def enqueue(queue: Queue, record: ExecutionRecord, traceparent: str, settings: Settings) -> None:
    # ttl keeps the job a little past the queue deadline: the worker, not RQ, decides expiry,
    # so that the record always ends as `expired` instead of silently vanishing.
    ttl = int(record.policy.queue_timeout_s) + settings.queue.setup_margin_s
    with redis_errors():
        queue.enqueue_call(
            TASK,
            args=({"execution_id": record.id, "traceparent": traceparent},),
            job_id=record.id,
            timeout=int(record.policy.timeout_s) + settings.queue.setup_margin_s,
            ttl=ttl,
            result_ttl=60,
            failure_ttl=settings.retention_s,
            description=f"execution {record.id}",
        )


def cancel_queued(queue: Queue, execution_id: str) -> None:
    """Take a queued job off the queue; a job already taken is stopped by its worker instead."""
    with redis_errors():
        queue.remove(execution_id)


def depth(queue: Queue) -> int:
    with redis_errors():
        return int(queue.count)


__all__ = [
    "TASK",
    "WEBHOOK_TASK",
    "cancel_queued",
    "depth",
    "enqueue",
    "enqueue_webhook",
    "make_queue",
    "make_webhook_queue",
]


def webhook_notifier(queue: Queue, settings: Settings) -> Callable[[ExecutionRecord], None]:
    """A store terminal hook: queue a delivery for executions that asked for a webhook."""

    def notify(record: ExecutionRecord) -> None:
        if record.webhook is not None:
            enqueue_webhook(queue, record.id, settings)

    return notify
