"""Surprises: when an execution of a script fails (above all `check.failed`, the script's ear),
an event that carries what an agent needs to resume; quiet successes make none, unless the
schedule asks for every firing (`notify: all`): then a success is a `script.succeeded` event with
its declared outputs and artifact links, delivered to the schedule's webhook the same way.

Which script and schedule an execution belongs to is read from its `origin`, which only the
service sets (labels are the client's and are not believed), and a schedule is followed only when
it is the execution's own tenant's: its webhook and secret are never used for another's execution.

A consumer group (`surprises`, in the API processes of every deployment on the Redis) reads the execution event stream;
for a failed script execution it appends an event to the tenant's stream `surprises:{tenant}`
(read with GET /v1/events) and, when the schedule that fired it has a webhook, stores the event
with the webhook under `surprise:{execution}` and puts a `script.failed` entry on the outbox for
the workers' webhook consumer to deliver, signed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import redis
from pydantic import BaseModel, Field

from execbox.core.metrics import LoopMetrics
from execbox.core.poison import Guard, consume
from execbox.core.redis import redis_errors, text
from execbox.core.streams import TERMINAL
from execbox.executions.events import consumer_group
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, StoredWebhook
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.schedules.keys import ScheduleKeys
from execbox.schedules.store import ScheduleStore

log = logging.getLogger(__name__)
TAIL_CHARS = 2000
KEPT = 10_000
"""Events kept per tenant."""
FAILED = (ExecutionStatus.FAILED, ExecutionStatus.EXPIRED)


class Surprise(BaseModel):
    id: str = Field("", description="The event's id in the tenant's stream (use it as `since`).")
    type: str = Field("script.failed", description="script.failed")
    at: float = Field(description="Unix time of the failure.")
    script: str = Field(description="name@version that ran.")
    schedule: str | None = Field(None, description="The schedule that fired it, if one did.")
    slot: float | None = Field(None, description="The slot's Unix time, for a scheduled run.")
    execution_id: str = Field(description="The execution (GET /v1/executions/{id}).")
    error: ExecutionError | None = Field(
        None, description="The categorized error; for check.failed its message and details."
    )
    stdout_tail: str = Field("", description="The end of its stdout.")
    stderr_tail: str = Field("", description="The end of its stderr.")
    outputs: dict[str, Any] | None = Field(None, description="Its declared outputs (a success's result).")
    artifacts: list[str] = Field(
        default_factory=list, description="Download paths (GET, with an API key) of what it wrote."
    )
    inputs: Any = Field(None, description="The inputs it ran with.")
    links: dict[str, str] = Field(default_factory=dict, description="The execution, its run record, the schedule.")


def surprise_of(record: ExecutionRecord, successes: bool = False) -> Surprise | None:
    """The event of a script's execution: of a failure, or (when asked) of a success too."""
    origin = record.origin
    if origin is None or not origin.script:
        return None
    failed = record.status in FAILED and record.error is not None
    if not failed and not (successes and record.status is ExecutionStatus.SUCCEEDED):
        return None
    links = {"execution": f"/v1/executions/{record.id}", "record": f"/v1/executions/{record.id}/record"}
    if origin.schedule:
        links["schedule"] = f"/v1/schedules/{origin.schedule}"
    return Surprise(type="script.failed" if failed else "script.succeeded", at=record.finished_at or time.time(),
                    script=origin.script, schedule=origin.schedule, slot=origin.slot, execution_id=record.id,
                    error=record.error, stdout_tail=record.stdout[-TAIL_CHARS:],
                    stderr_tail=record.stderr[-TAIL_CHARS:], artifacts=[a.url for a in record.artifacts],
                    outputs=record.outputs,
                    inputs=record.inputs, links=links)  # fmt: skip


class Surprises:
    def __init__(self, client: redis.Redis, keys: ScheduleKeys, executions: ExecutionStore, schedules: ScheduleStore,
                 retention_s: int) -> None:  # fmt: skip
        self.redis, self.keys, self._retention_s = client, keys, retention_s
        self._executions, self._schedules = executions, schedules
        self._group = consumer_group(
            "surprises"
        )  # one group for every deployment on this Redis: each event recorded once

    def list(self, tenant: str, kind: str | None = None, since: str = "-", limit: int = 100) -> list[Surprise]:
        start = f"({since}" if since != "-" else "-"
        with redis_errors():
            entries: Any = self.redis.xrange(self.keys.surprises(tenant), start, "+", count=limit)
        found = [Surprise.model_validate({**json.loads(fields[b"event"]), "id": text(i)}) for i, fields in entries]
        return [s for s in found if kind in (None, s.type)]

    def run(self, stop: threading.Event, consumer: str, metrics: LoopMetrics | None = None) -> None:
        """The consumer's loop: each event handled under the loop's guard (execbox.core.poison), so one
        that fails is retried with backoff, then set aside, and never stops the others' events."""
        events = self._executions.events
        guard = Guard(self.redis, self.keys, "surprises", (events.key,), metrics)
        consume(events, self._group, consumer, self.handle, stop, guard, idle_s=30.0)

    def handle(self, event: dict[str, str]) -> None:
        if event.get("type") == TERMINAL and event.get("status") in ("failed", "expired", "succeeded"):
            self._record(event["id"])

    def _record(self, execution_id: str) -> None:
        record = self._executions.get(execution_id)
        if record is None:
            return
        origin = record.origin
        schedule = self._schedules.get(origin.schedule) if origin is not None and origin.schedule else None
        if origin is not None and schedule is not None and schedule.tenant != record.tenant:
            log.warning("execution %s links schedule %s of another tenant; not followed", execution_id, schedule.id)
            record = record.model_copy(update={"origin": origin.model_copy(update={"schedule": None, "slot": None})})
            schedule = None
        surprise = surprise_of(record, successes=schedule is not None and schedule.notify == "all")
        if surprise is None:
            return
        body = surprise.model_dump_json(exclude={"id"})
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.xadd(self.keys.surprises(record.tenant), {"event": body}, maxlen=KEPT, approximate=True)
            if schedule is not None and schedule.webhook is not None:
                stored = json.dumps({"event": json.loads(body), "webhook": schedule.webhook.model_dump()})
                pipe.set(self.keys.surprise(execution_id), stored, ex=self._retention_s)
                self._executions.events.append(pipe, {"type": surprise.type, "id": execution_id})
            pipe.execute()


def stored_surprise(
    client: redis.Redis, keys: ScheduleKeys, execution_id: str
) -> tuple[dict[str, Any], StoredWebhook] | None:
    """The event and the webhook to deliver it to (for the workers' webhook consumer)."""
    with redis_errors():
        raw = client.get(keys.surprise(execution_id))
    if raw is None:
        return None
    stored = json.loads(raw)
    return stored["event"], StoredWebhook.model_validate(stored["webhook"])
