"""ExecutionStore against a real Redis: the compare-and-set, the terminal transaction, the sweeps."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from execbox.executions.record import ExecutionRecord
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.settings import Settings
from tests.unit.conftest import make_record

pytestmark = pytest.mark.redis


def test_a_transition_retries_when_the_record_changes_under_it(settings: Settings, client: redis.Redis) -> None:
    store = ExecutionStore(client, settings)
    record = make_record(settings)
    store.create(record)
    other = ExecutionStore(redis.Redis.from_url(settings.redis.url), settings)
    calls: list[int] = []

    def start(current: ExecutionRecord) -> ExecutionStatus:
        calls.append(current.attempt)
        if len(calls) == 1:
            # Another process writes between this one's WATCH and its EXEC: the commit must fail.
            other.update(record.id, lambda r: r.labels.update({"written": "by another"}))
        current.attempt += 1
        return ExecutionStatus.RUNNING

    moved = store.transition(record.id, {ExecutionStatus.QUEUED}, "worker-1", start)

    assert len(calls) == 2, "the first attempt must be retried after the concurrent write"
    assert moved is not None and moved.status is ExecutionStatus.RUNNING
    stored = store.get(record.id)
    assert stored is not None
    assert stored.labels == {"written": "by another"}, "the concurrent write must survive the retry"
    assert stored.attempt == 1
    assert [t.status for t in stored.transitions] == [ExecutionStatus.QUEUED, ExecutionStatus.RUNNING]


def test_a_transition_out_of_a_status_not_allowed_changes_nothing(settings: Settings, client: redis.Redis) -> None:
    store = ExecutionStore(client, settings)
    record = make_record(settings)
    store.create(record)
    called: list[ExecutionRecord] = []

    assert store.transition(record.id, {ExecutionStatus.RUNNING}, "w", lambda r: called.append(r)) is None
    assert store.transition("exe_" + "0" * 26, {ExecutionStatus.QUEUED}, "w", lambda r: called.append(r)) is None
    assert called == []
    assert store.get(record.id) == record


def test_the_terminal_transaction_writes_the_event_and_frees_the_run(settings: Settings, client: redis.Redis) -> None:
    store = ExecutionStore(client, settings)
    heard: list[str] = []
    store.listeners.append(lambda r: heard.append(r.status.value))
    record = make_record(settings)
    store.create(record)
    client.zadd(store.keys.active(record.tenant), {record.id: time.time()})
    store.transition(record.id, {ExecutionStatus.QUEUED}, "w", lambda r: ExecutionStatus.RUNNING)
    store.renew_lease(record.id, "w")
    assert client.sismember(store.keys.running, record.id)

    store.transition(record.id, {ExecutionStatus.RUNNING}, "w", lambda r: ExecutionStatus.SUCCEEDED)

    events: Any = client.xrange(store.keys.events)
    assert [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in events] == [
        {"type": "execution.terminal", "id": record.id, "status": "succeeded"}
    ]
    assert heard == ["succeeded"], "in-process listeners hear of the end once"
    assert not client.exists(store.keys.lease(record.id))
    assert not client.sismember(store.keys.running, record.id)
    assert client.zscore(store.keys.active(record.tenant), record.id) is None
    assert client.zscore(store.keys.deadlines, record.id) is None
    # A second terminal transition is refused: the event is never written twice.
    assert store.transition(record.id, {ExecutionStatus.RUNNING}, "w", lambda r: ExecutionStatus.FAILED) is None
    assert client.xlen(store.keys.events) == 1


def test_expiry_settles_only_executions_past_their_queue_deadline(settings: Settings, client: redis.Redis) -> None:
    store = ExecutionStore(client, settings)
    due = make_record(settings).model_copy(update={"queue_deadline": time.time() - 1.0})
    waiting = make_record(settings)
    store.create(due)
    store.create(waiting)

    assert store.due_for_expiry() == [due.id]
    expired = store.expire_if_due(due.id, "reaper")
    assert expired is not None and expired.status is ExecutionStatus.EXPIRED
    assert expired.error is not None and expired.error.category.value == "expired" and expired.error.retryable
    assert store.expire_if_due(waiting.id, "reaper") is None
    assert store.due_for_expiry() == []


def test_a_running_execution_is_lost_only_once_its_lease_lapsed(settings: Settings, client: redis.Redis) -> None:
    short = settings.model_copy(update={"worker": settings.worker.model_copy(update={"lease_s": 0.2})})
    store = ExecutionStore(client, short)
    record = make_record(short)
    store.create(record)

    def start(r: ExecutionRecord) -> ExecutionStatus:
        r.started_at, r.worker = time.time() - 1.0, "w"
        return ExecutionStatus.RUNNING

    store.transition(record.id, {ExecutionStatus.QUEUED}, "w", start)
    store.renew_lease(record.id, "w")
    assert store.fail_if_lost(record.id, "reaper") is None, "a live lease keeps the run"
    client.delete(store.keys.lease(record.id))

    lost = store.fail_if_lost(record.id, "reaper")

    assert lost is not None and lost.status is ExecutionStatus.FAILED
    assert lost.error is not None and lost.error.details["reason"] == "worker_lost"
