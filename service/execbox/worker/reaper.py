"""The reaper: settles what dead workers and idle queues leave behind.

Each worker runs it at start-up and then periodically. It expires queued executions past their
deadline, puts back the queue entries a fail-over lost and the dispatch tickets RQ lost (see
execbox.executions.queue), fails running executions whose worker stopped renewing its lease
(sandbox.error, retryable; a declared effect may instead run again in place or end
unknown_outcome: execbox.executions.effects), ends sessions whose worker was lost, and removes
execbox containers and egress networks on its own engine that no live worker (or live session)
owns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from execbox.core.errors import ServiceError
from execbox.core.poison import Guard
from execbox.executions.lifecycle import settle_lost
from execbox.executions.queue import make_queue, restore_tickets, return_lost_takes
from execbox.fleet.registry import Heartbeat
from execbox.sandbox.runtime import ContainerInfo
from execbox.sessions.service import ended_error, settle_waiting
from execbox.sessions.status import SessionEnd
from execbox.worker.context import WorkerContext

log = logging.getLogger(__name__)
BY = "reaper"


def report_health(ctx: WorkerContext) -> None:
    """Tell the API (through Redis) that this worker lives and whether its engine answers."""
    missing: list[str] = []
    runtimes: list[str] = []
    try:
        ctx.runtime.ping()
        ok, detail = True, "docker reachable"
        runtimes = ctx.runtime.runtimes()
        for language in ctx.languages:
            try:
                ctx.runtime.image_id(language.image)
            except ServiceError:
                missing.append(language.image)
    except ServiceError as exc:
        ok, detail = False, exc.message
    warm = sum(ctx.pool.idle().values()) if ctx.pool is not None else 0
    draining = ctx.drain.check()
    # A drained worker takes no session: its slots leave the fleet's capacity, so admission does not count on them.
    slots = 0 if draining else ctx.settings.sessions.per_worker
    beat = Heartbeat(ctx.name, ok, detail, missing_images=missing, runtimes=runtimes, warm=warm,
                     session_slots=slots, queue=ctx.settings.queue.name, node=ctx.node,
                     draining=draining)  # fmt: skip
    ctx.fleet.report(beat, ttl_s=3 * ctx.settings.worker.reaper_interval_s)
    ctx.last_beat = beat


def sweep(ctx: WorkerContext, unowned_before: set[str] | None = None) -> dict[str, int]:
    """One sweep. `unowned_before` carries the containers the previous sweep found without an owner
    (the periodic loop passes its own set); None removes unowned containers at once (`execbox reap`)."""
    counts = {
        "expired": 0,
        "entries": 0,
        "tickets": 0,
        "lost": 0,
        "sessions": 0,
        "slots": 0,
        "containers": 0,
        "networks": 0,
        "artifact_dirs": 0,
        "input_files": 0,
    }
    # One record that cannot be settled (unreadable, say) is logged and counted by the guard, and
    # the sweep goes on with the others (execbox.core.poison).
    guard = _guard(ctx)

    def reclaim() -> None:
        # A slot taken by an API that died before creating its execution (or one whose release was
        # lost) is given back; a minute is far longer than any admission takes to create.
        counts["slots"] = ctx.slots.reclaim(older_than_s=60.0, ended=lambda execution_id: _ended(ctx, execution_id))

    guard.item("the reclaim of quota slots", reclaim)

    def settle(action: Callable[[str, str], object], execution_id: str, count: str) -> None:
        if action(execution_id, BY) is not None:
            counts[count] += 1

    for execution_id in ctx.store.due_for_expiry():
        guard.item(f"execution {execution_id}", partial(settle, ctx.store.expire_if_due, execution_id, "expired"))
    # Entries before tickets: an entry put back is counted among those lacking a ticket.
    counts["entries"] = return_lost_takes(ctx.store.redis, ctx.settings, ctx.store.get, ctx.settings.worker.lease_s)
    counts["tickets"] = restore_tickets(make_queue(ctx.store.redis, ctx.settings), ctx.settings, ctx.backstop_s)

    def lost(execution_id: str) -> None:
        if settle_lost(ctx.store, ctx.settings, ctx.backstop_s, execution_id, BY) is not None:
            counts["lost"] += 1

    for execution_id in ctx.store.running():
        guard.item(f"execution {execution_id}", partial(lost, execution_id))
    counts["sessions"] = _end_lost_sessions(ctx, guard)
    now = time.time()
    unowned_now: set[str] = set()
    live_workers = {beat.name for beat in ctx.fleet.alive()}
    for container in ctx.runtime.managed_containers(ctx.settings.redis.key_prefix):
        owned = _owned(ctx, container, live_workers)
        if owned or now - container.created_at < ctx.settings.worker.orphan_grace_s:
            continue
        unowned_now.add(container.id)
        # Removed only when unowned in two sweeps in a row: a live worker whose lease lapsed while
        # Redis was away renews it within a third of the lease period once Redis is back.
        if unowned_before is None or container.id in unowned_before:
            log.info("removing orphaned sandbox container %s of %s", container.id[:12], container.execution_id)
            ctx.runtime.remove(container.id)
            counts["containers"] += 1
    # Networks after containers: a network is removable once the run's container is gone.
    for network in ctx.runtime.managed_networks(ctx.settings.redis.key_prefix):
        if _owned(ctx, network, live_workers) or now - network.created_at < ctx.settings.worker.orphan_grace_s:
            continue
        unowned_now.add(network.id)
        if unowned_before is None or network.id in unowned_before:
            log.info("removing orphaned egress network %s of %s", network.id[:12], network.execution_id)
            ctx.runtime.remove_network(network.id, ctx.settings.egress.container)
            counts["networks"] += 1
    if unowned_before is not None:
        unowned_before.clear()
        unowned_before.update(unowned_now)
    counts["artifact_dirs"] = ctx.artifacts.delete_older_than(now - ctx.settings.retention_s)

    def sweep_inputs() -> None:  # S3 objects of input files whose meta expired (data in Redis expires with it)
        counts["input_files"] = ctx.files.sweep(now)

    guard.item("the sweep of input file objects", sweep_inputs)
    if any(counts.values()):
        log.info("reaper sweep", extra=counts)
    return counts


def _end_lost_sessions(ctx: WorkerContext, guard: Guard) -> int:
    """End the sessions whose worker stopped renewing their lease, or that no worker took in time."""
    ended: list[str] = []
    now = time.time()
    for session_id in ctx.sessions.live():
        guard.item(f"session {session_id}", partial(_end_if_lost, ctx, session_id, now, ended))
    return len(ended)


def _end_if_lost(ctx: WorkerContext, session_id: str, now: float, ended: list[str]) -> None:
    record = ctx.sessions.get(session_id)
    if record is None:  # admitted, never stored: its slot of the fleet's goes back
        ctx.sessions.forget(session_id, ctx.settings.sessions.start_timeout_s)
        return
    if record.worker is None:
        if now - record.created_at < ctx.settings.sessions.start_timeout_s:
            return
        reason, why = (
            SessionEnd.SANDBOX_ERROR,
            "no worker took it in time: every worker holds as many sessions as it may "
            "(EXECBOX_SESSIONS__PER_WORKER), or none runs; retry later",
        )
    elif ctx.sessions.lease_alive(session_id):
        return
    else:
        reason = SessionEnd.WORKER_LOST
        why = f"the worker holding it ({record.worker}) was lost; its state (variables, files) is gone"
    done = ctx.sessions.end(session_id, reason, why, worker=record.worker, unclaimed=record.worker is None)
    if done is not None:
        ended.append(session_id)
        log.warning("session %s ended by the reaper: %s", session_id, why)
        settle_waiting(ctx.sessions, ctx.store, session_id, ended_error(done), BY)


def _ended(ctx: WorkerContext, execution_id: str) -> bool:
    """The execution has ended, or was never created."""
    record = ctx.store.get(execution_id)
    return record is None or record.status.terminal


def _owned(ctx: WorkerContext, container: ContainerInfo, live_workers: set[str]) -> bool:
    """A run's container belongs to its execution's lease, held by the worker that made it (an
    attempt whose worker was declared lost leaves a container the next attempt's lease must not
    keep); a warm one to the worker that made it."""
    if container.execution_id is not None:
        holder = ctx.store.lease_holder(container.execution_id)
        return holder is not None and (container.worker is None or holder == container.worker)
    if container.session is not None:
        return ctx.sessions.lease_alive(container.session)
    return container.pool is not None and container.worker in live_workers


def run(ctx: WorkerContext, stop: threading.Event) -> None:
    """The periodic loop (under the worker's loop supervisor): a sweep that fails is logged and
    counted, and the next one comes at its interval."""
    guard = _guard(ctx)
    unowned: set[str] = set()
    while True:
        try:
            report_health(ctx)
            sweep(ctx, unowned)
        except ServiceError as exc:
            log.warning("reaper sweep failed: %s", exc.message)
        except Exception as exc:  # each record is guarded in the sweep; this is what is left
            guard.note(exc, "a sweep")
        if stop.wait(ctx.settings.worker.reaper_interval_s):
            return


def _guard(ctx: WorkerContext) -> Guard:
    return Guard(ctx.store.redis, ctx.store.keys, "reaper", metrics=ctx.metrics.loops)
