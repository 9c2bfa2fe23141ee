"""`execbox worker`: one RQ worker process that runs executions one at a time.

It uses RQ's SimpleWorker (no fork per job): the Docker client, image ids and language table are
built once per process, and a worker killed outright takes its job with it, which the lease and
the reaper then settle. Run several processes (or containers) for parallelism.

A drained node (execbox.fleet.nodes) holds its workers off the queue: between jobs the worker looks
at the drain before each short dequeue (at most `_DEQUEUE_S` blocked, so a drain is seen within
about a second) and, while drained, waits without dequeuing; a ticket dequeued in the instant a
drain arrived is put back at the front of the queue, untouched, for another node's worker.

A stop (SIGTERM or SIGINT) lets the job in progress finish (RQ's warm shutdown; a second signal ends
it at once), then gives the clean-up `STOP_GRACE_S` in all: held sessions closed, the warm pool
removed, deferred removals run. Each waits only until that deadline, in daemon threads, so the
process exits within its grace whatever the engine does; what is still under way then carries the
worker's labels and is removed by another worker's reaper once this one's heartbeat is gone. Should
anything else hold the process (RQ's own teardown included), it exits at once `HARD_STOP_S` after the
job's end.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import WorkerStatus

from execbox.core import logs
from execbox.core.errors import ServiceError
from execbox.core.poison import Loops
from execbox.core.stopping import left, run_until
from execbox.executions.queue import make_queue
from execbox.keyschema import LOOPS
from execbox.sandbox.runtime import Runtime
from execbox.sessions.host import SessionHost
from execbox.settings import Settings
from execbox.webhooks.delivery import WebhookConsumer
from execbox.worker import gate, health, reaper
from execbox.worker.context import WorkerContext, current, install

log = logging.getLogger(__name__)

_DEQUEUE_S = 1
"""Longest a worker blocks on the queue (RQ's BLMOVE, whole seconds) before it looks at the drain again."""
_DRAINED_POLL_S = 0.5
"""How often a drained worker looks whether its node was undrained."""

STOP_GRACE_S = 10.0
"""The whole clean-up after the queue loop ends (sessions, warm pool, deferred removals), within the
stop grace a supervisor gives once the job in progress has ended (the test harness waits 15 s)."""

HARD_STOP_S = STOP_GRACE_S + 10.0
"""From the end of the job in progress, the longest a stopping worker lives: RQ's own teardown (a few
Redis calls, its pub/sub thread) and the clean-up; past it the process exits at once (`os._exit`),
leaving what is still under way, labelled, to the reaper."""

UNSUBSCRIBE_S = 2.0
"""How long a stopping worker waits for RQ to end its pub/sub listener."""

_stopping = threading.Event()
"""Set by every SIGTERM/SIGINT, before and after RQ installs its own handlers: no loop of the main
thread (start-up, waiting for Redis, a new RQ worker after a Redis outage) outlives a stop request."""


class RQWorker(SimpleWorker):
    """RQ's in-process worker; each job gets its own log scope, which the job binds to the
    execution it takes, so RQ's lines about the job carry that execution's ids."""

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's dequeue, held off while the node is drained and cut into short blocks so that a drain
        is seen within about a second (RQ's own block is minutes long)."""
        drain = current().drain
        if timeout is None:  # burst: take what is there now, unless drained
            return None if drain.check() else super().dequeue_job_and_maintain_ttl(None, max_idle_time)
        idle_since = time.monotonic()
        while True:
            if drain.check():
                self._wait_while_drained()
            # RQ's idle limit makes its loop give up after one short block instead of looping inside.
            result = super().dequeue_job_and_maintain_ttl(min(timeout, _DEQUEUE_S), max_idle_time=_DEQUEUE_S)
            if result is not None:
                return result
            if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                return None

    def _wait_while_drained(self) -> None:
        """Stay registered and alive (RQ's heartbeat, our own through the reaper) until undrained. A stop
        request raises out of the sleep, as it does out of RQ's own blocking dequeue."""
        self.set_state(WorkerStatus.SUSPENDED)
        self.procline(f"drained: node {current().node}")  # type: ignore[no-untyped-call]
        while current().drain.check():
            self.heartbeat()
            time.sleep(_DRAINED_POLL_S)  # the drain is a key to look at, not an event to block on
        self.set_state(WorkerStatus.IDLE)

    def execute_job(self, job: Job, queue: Queue) -> None:
        with logs.bound(None, None):
            if current().drain.check():
                self._give_back(job, queue)
                return
            reason = gate.refusal(job)
            if reason is None:
                super().execute_job(job, queue)
            else:
                self._refuse(job, queue, reason)

    def _give_back(self, job: Job, queue: Queue) -> None:
        """Put a ticket dequeued as the drain arrived back at the front of its queue, in one transaction
        (out of RQ's intermediate list, where a dequeued job waits until it starts)."""
        with queue.connection.pipeline() as pipe:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            queue.push_job_id(job.id, pipeline=pipe, at_front=True)
            pipe.execute()
        log.info("node drained: ticket %s put back for another node", job.id)

    def _refuse(self, job: Job, queue: Queue, reason: str) -> None:
        """Record a message that is not one of execbox's jobs as failed, without running anything."""
        message = (
            f"refused: {gate.describe(job)} is not an execbox job function called as execbox calls it "
            f"({reason}); nothing was imported or run"
        )
        log.error("queue message refused", extra={"job_id": job.id, "reason": reason, "function": gate.describe(job)})
        current().metrics.jobs_refused.labels(reason).inc()
        gate.disarm(job)
        self.handle_job_failure(job, queue, exc_string=message)

    def _install_signal_handlers(self) -> None:
        super()._install_signal_handlers()  # type: ignore[no-untyped-call]
        if _stopping.is_set():  # asked to stop while starting or waiting for Redis: leave before a job
            self._stop_requested = True

    def request_stop(self, signum: int, frame: object) -> None:
        _stopping.set()  # RQ's own flag lives on this worker object only; the loop around it must know too
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def teardown(self) -> None:
        if _stopping.is_set():  # the loop is left for good (no job runs any more): bound what follows
            arm_hard_stop(HARD_STOP_S)
        super().teardown()  # type: ignore[no-untyped-call]

    def unsubscribe(self) -> None:
        """RQ's unsubscribe, given UNSUBSCRIBE_S: RQ's listener waits for a message up to 60 s at a time
        and closing its connection can wait for that read (a stop hung 15 s there, with no job running).
        The subscription ends with the connection anyway when the process exits."""
        run_until(time.monotonic() + UNSUBSCRIBE_S, [super().unsubscribe], "pub/sub unsubscribe")


_hard_stop: threading.Timer | None = None


def arm_hard_stop(after_s: float) -> None:
    """Exit the process `after_s` from now whatever it is blocked in (once; later calls keep the first)."""
    global _hard_stop
    if _hard_stop is not None:
        return

    def hard_stop() -> None:
        log.error("worker still running %.0f s after its stop began: exiting now; the reaper removes what it left",
                  after_s)  # fmt: skip
        logging.shutdown()
        os._exit(1)

    _hard_stop = threading.Timer(after_s, hard_stop)
    _hard_stop.daemon = True
    _hard_stop.start()


def _note_stop(signum: int, frame: object) -> None:
    """Before RQ's handlers: the first signal asks for a stop, a second one stops at once."""
    if _stopping.is_set():
        raise SystemExit(f"stopped by a second signal {signum} during start-up")
    _stopping.set()


def run_worker(
    settings: Settings,
    burst: bool = False,
    name: str | None = None,
    runtime: Runtime | None = None,
    stop_grace_s: float = STOP_GRACE_S,
) -> None:
    """Serve the queue until stopped (`burst`: until it is empty); `runtime` None: Docker's."""
    # As a container's PID 1 the process would ignore SIGTERM until RQ installs its handlers; a
    # stop during start-up must still end in the clean shutdown below (the pool is drained).
    signal.signal(signal.SIGTERM, _note_stop)
    signal.signal(signal.SIGINT, _note_stop)
    logs.configure(settings.log_level, "worker")
    ctx = WorkerContext.build(settings, name, runtime)
    install(ctx)
    try:
        if not _stopping.is_set():
            ctx.runtime.ping()
    except ServiceError as exc:
        # Keep serving: each job then fails fast as sandbox.error instead of waiting in the queue.
        log.error("Docker engine unreachable at start-up: %s", exc.message)
    if settings.telemetry.worker_metrics_port is not None:  # /metrics and /readyz
        health.serve(ctx, settings.telemetry.worker_metrics_port, settings.telemetry.worker_metrics_host)
    stop = threading.Event()
    loops = Loops(stop, LOOPS, ctx.metrics.loops)  # each supervised: restarted if it ever dies
    loops.start("reaper", lambda stop: reaper.run(ctx, stop))
    loops.start("webhooks", WebhookConsumer(ctx.store, settings.webhooks, ctx.name, ctx.metrics.loops).run)
    if ctx.pool is not None and not _stopping.is_set():  # a stop during start-up makes nothing new
        ctx.pool.start(stop)
    sessions = SessionHost(ctx, paused=ctx.drain.check) if settings.sessions.per_worker > 0 else None
    if sessions is not None:
        loops.start("sessions", sessions.run)
    try:
        for generation in itertools.count():
            if _stopping.is_set():
                return
            worker = RQWorker(
                [make_queue(ctx.store.redis, settings)],
                connection=ctx.store.redis,
                serializer=JSONSerializer,
                # RQ keeps a dead worker's name registered for a while; a restarted loop takes a new one.
                name=ctx.name if generation == 0 else f"{ctx.name}.{generation}",
            )
            log.info("worker %s listening on queue %s", worker.name, settings.queue.name)
            try:
                worker.work(burst=burst, logging_level=settings.log_level.upper(), with_scheduler=False)
                return
            except RedisConnectionError as exc:
                # Redis went away (restart, failover): wait for it, then serve again instead of dying.
                log.error("lost Redis (%s); waiting for it to come back", exc)
                try:
                    _wait_for_redis(ctx)
                except StopRequested:  # RQ's handler (still installed) raises it out of the wait: a clean stop
                    return
    finally:
        stop.set()
        shut_down(ctx, sessions, stop_grace_s)


def shut_down(ctx: WorkerContext, sessions: SessionHost | None, grace_s: float) -> None:
    """The clean-up of a stopping worker (its loops' `stop` already set), over within `grace_s`."""
    began = time.monotonic()
    deadline = began + grace_s
    if sessions is not None:
        sessions.join(left(deadline))  # each ends its session and removes its container
    pool = ctx.pool
    if pool is not None:
        run_until(deadline, [lambda: pool.drain(left(deadline))], "warm pool drain")
    # Containers and networks of finished runs still waiting to be removed.
    run_until(deadline, [ctx.runtime.close], "deferred sandbox removals")
    log.info("worker %s stopped in %.1f s", ctx.name, time.monotonic() - began)


def _wait_for_redis(ctx: WorkerContext) -> None:
    """Until Redis answers again, or a stop is asked for (then the caller's loop ends)."""
    delay = 0.5
    while not _stopping.is_set():
        try:
            ctx.store.ping()
            log.info("Redis is back")
            return
        except ServiceError:
            _stopping.wait(delay)  # nothing to block on while the server is down but a stop
            delay = min(delay * 2, 10.0)
