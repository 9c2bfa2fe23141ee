"""Quota windows and fair dispatch against a real Redis (the Lua scripts the API and workers share)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from execbox.executions.queue import (
    depth,
    enqueue,
    make_queue,
    restore_tickets,
    return_lost_takes,
    take_next,
    taken,
)
from execbox.executions.status import ExecutionStatus
from execbox.keyschema import Keys
from execbox.settings import Settings
from execbox.tenancy.errors import PolicyNotAllowed, QueueFull, RateLimited
from execbox.tenancy.quotas import Quotas, Slots
from tests.unit.conftest import make_record

pytestmark = pytest.mark.redis
TENANTS = """
default: {running: 2, per_minute: 3, policies: [default]}
tenants:
  small: {running: 1, per_minute: 100, policies: [default]}
"""


def quotas(settings: Settings, client: redis.Redis, tmp_path: Path, max_depth: int = 100) -> Quotas:
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    return Quotas.load(tmp_path / "tenants.yaml", Slots(client, Keys(settings.redis.key_prefix)), max_depth)


def test_the_minute_window_counts_admissions_only(settings: Settings, client: redis.Redis) -> None:
    slots = Slots(client, Keys(settings.redis.key_prefix))
    minute = int(time.time() // 60)

    verdicts = [slots.admit("alpha", f"exe_{i}", minute, per_minute=2, running=10) for i in range(4)]

    assert verdicts == [("ok", 1), ("ok", 2), ("rate", 2), ("rate", 2)], "a refusal does not use up the window"
    assert client.zcard(slots.keys.active("alpha")) == 2, "a refused submission takes no running slot"
    assert slots.admit("alpha", "exe_next", minute + 1, per_minute=2, running=10) == ("ok", 1), "a new minute"
    assert 0 < client.ttl(slots.keys.rate("alpha", minute)) <= 120, "a window's counter expires on its own"


def test_the_running_limit_frees_when_an_execution_is_released(settings: Settings, client: redis.Redis) -> None:
    slots = Slots(client, Keys(settings.redis.key_prefix))
    minute = int(time.time() // 60)

    assert slots.admit("alpha", "exe_a", minute, per_minute=10, running=1) == ("ok", 1)
    assert slots.admit("alpha", "exe_b", minute, per_minute=10, running=1) == ("running", 1)
    assert slots.admit("beta", "exe_c", minute, per_minute=10, running=1) == ("ok", 1), "per tenant"
    slots.release("alpha", "exe_a")
    assert slots.admit("alpha", "exe_b", minute, per_minute=10, running=1) == ("ok", 2)


def test_reclaim_frees_only_old_slots_of_ended_executions(settings: Settings, client: redis.Redis) -> None:
    slots = Slots(client, Keys(settings.redis.key_prefix))
    active = slots.keys.active("alpha")
    client.zadd(active, {"exe_ended": time.time() - 120, "exe_live": time.time() - 120, "exe_new": time.time()})

    freed = slots.reclaim(older_than_s=60, ended=lambda execution_id: execution_id != "exe_live")

    assert freed == 1
    members: Any = client.zrange(active, 0, -1)
    assert sorted(m.decode() for m in members) == ["exe_live", "exe_new"]


def test_quotas_refuse_with_the_right_error_and_headers(
    settings: Settings, client: redis.Redis, tmp_path: Path
) -> None:
    limits = quotas(settings, client, tmp_path)
    admitted = [limits.admit("alpha", "default", f"exe_{i}", queue_depth=0) for i in range(2)]
    assert [a.headers["RateLimit-Remaining"] for a in admitted] == ["2", "1"]

    with pytest.raises(RateLimited) as running:
        limits.admit("alpha", "default", "exe_3", queue_depth=0)
    assert running.value.headers["Retry-After"] == "1"
    with pytest.raises(PolicyNotAllowed):
        limits.admit("small", "gpu", "exe_4", queue_depth=0)
    with pytest.raises(QueueFull) as full:
        quotas(settings, client, tmp_path, max_depth=5).admit("small", "default", "exe_5", queue_depth=5)
    assert full.value.http_status == 503 and full.value.headers["Retry-After"]


def test_dispatch_takes_tenants_in_turn_and_each_tenant_in_order(settings: Settings, client: redis.Redis) -> None:
    queue = make_queue(client, settings)
    submitted = [make_record(settings, "flood") for _ in range(4)] + [make_record(settings, t) for t in ("b", "c")]
    for record in submitted:
        enqueue(queue, record, f"00-{record.trace_id}-{'1' * 16}-01", settings, backstop_s=60)
    assert depth(queue) == 6, "one ticket per entry"

    taken = []
    while (entry := take_next(client, settings)) is not None:
        taken.append(entry.execution_id)

    flood = [r.id for r in submitted[:4]]
    assert taken == [flood[0], submitted[4].id, submitted[5].id, flood[1], flood[2], flood[3]]
    assert client.exists(*Keys(settings.redis.key_prefix).queue(settings.queue.name)[:2]) == 0, "the ring is empty"


def test_a_ticket_lost_by_a_stopping_worker_is_restored_and_its_entry_runs(
    settings: Settings, client: redis.Redis
) -> None:
    """RQ moves a job to its intermediate list before the worker marks itself busy; a worker
    stopped in that instant leaves the ticket there and its entry without one (CI's stack test
    once found an execution still queued after a worker's graceful stop)."""
    queue = make_queue(client, settings)
    records = [make_record(settings, tenant) for tenant in ("a", "a", "b")]
    for record in records:
        enqueue(queue, record, f"00-{record.trace_id}-{'1' * 16}-01", settings, backstop_s=60)
    client.lmove(queue.key, queue.intermediate_queue_key)  # what the stopped worker's dequeue did
    assert depth(queue) == 2

    assert restore_tickets(queue, settings, backstop_s=60) == 1
    assert restore_tickets(queue, settings, backstop_s=60) == 0, "nothing more is missing"
    assert depth(queue) == 3
    taken = []
    for _ in range(depth(queue)):  # each ticket takes one entry, as run_next does
        client.lpop(queue.key)
        entry = take_next(client, settings)
        assert entry is not None
        taken.append(entry.execution_id)
    assert sorted(taken) == sorted(r.id for r in records)
    assert restore_tickets(queue, settings, backstop_s=60) == 0, "no entry waits, so no ticket is added"


def test_an_entry_whose_take_a_fail_over_lost_goes_back_and_runs(settings: Settings, client: redis.Redis) -> None:
    """The take popped the entry (and reached the replica Sentinel promotes); the worker's move to
    running did not. The record is queued with no entry: the reaper puts the entry back, at the
    head of its tenant's list, and restores its ticket."""
    queue = make_queue(client, settings)
    first, second = make_record(settings, "a"), make_record(settings, "a")
    records = {r.id: r for r in (first, second)}
    for record in (first, second):
        enqueue(queue, record, f"00-{record.trace_id}-{'1' * 16}-01", settings, backstop_s=60)
    client.lpop(queue.key)  # the ticket the worker took
    lost = take_next(client, settings)
    assert lost is not None and lost.execution_id == first.id

    assert return_lost_takes(client, settings, records.get, grace_s=60) == 0, "a take within its grace is left"
    assert return_lost_takes(client, settings, records.get, grace_s=0) == 1
    assert return_lost_takes(client, settings, records.get, grace_s=0) == 0, "put back once"
    assert restore_tickets(queue, settings, backstop_s=60) == 1
    again = take_next(client, settings)
    assert again is not None and again.execution_id == first.id, "back at the head of its tenant's list"
    assert again.traceparent == lost.traceparent


def test_a_taken_entry_whose_record_left_queued_or_is_unreadable_is_dropped_not_put_back(
    settings: Settings, client: redis.Redis
) -> None:
    queue = make_queue(client, settings)
    running, cancelled, acknowledged = (make_record(settings, "a") for _ in range(3))
    for record in (running, cancelled, acknowledged):
        enqueue(queue, record, f"00-{record.trace_id}-{'1' * 16}-01", settings, backstop_s=60)
    entries = [take_next(client, settings) for _ in range(3)]
    assert entries[2] is not None
    running.status, cancelled.status = ExecutionStatus.RUNNING, ExecutionStatus.CANCELLED
    taken(client, settings, entries[2])  # the worker saw it running and said so
    client.zadd(Keys(settings.redis.key_prefix).taken(settings.queue.name), {"{not json": 0, '{"id": 1}': 0})
    records = {r.id: r for r in (running, cancelled)}

    assert return_lost_takes(client, settings, records.get, grace_s=0) == 0
    assert client.zcard(Keys(settings.redis.key_prefix).taken(settings.queue.name)) == 0, "each one dropped"
    assert take_next(client, settings) is None, "nothing was put back"
