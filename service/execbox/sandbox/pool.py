"""The warm pool: containers created and started ahead of time, each used for one run only.

A worker keeps warm containers per pool class (a language or variant with a policy's limits that
cannot change on a running container: image, command, disk, CPU time, pids; network always none),
started with the full hardening, their launcher waiting for its frame on stdin. A run whose spec
fits a class takes one (memory and CPU are then set to the run's own values) and the container is
removed after that run like any other: never reused. How many a class holds follows its recent
arrivals within the operator's floor and ceiling and the host's memory budget (see poolsize).

A background thread refills: after a run's result is stored (so that the engine's work on a
successor does not compete with the run for the CPU), never while a run of this worker is in
progress unless `refill_during_runs`, with at most `parallelism` creations at once. It also
recycles containers that waited longer than `max_idle_s`, removes those above a fallen target, and
forgets containers that died. An empty pool is not an error and never a wait: take() answers at
once and the run creates its own container (cold) rather than wait for a refill in flight.

Pools are per worker process: a worker takes only containers it made, so a take is a pop under a
lock and two workers on one engine can never get the same container. Pool containers carry the
worker's name and the class in their labels; the reaper removes those whose worker is gone, and a
worker that stops cleanly removes its own: drain() never waits past its deadline (creations run in
daemon threads and are not waited for once the pool is closed; one that ends later removes its
container itself, and one still under way when the process exits leaves it, labelled, to the reaper).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from execbox.core.errors import ServiceError
from execbox.core.stopping import left, run_until
from execbox.sandbox.poolsize import Demand, within_budget
from execbox.sandbox.runtime import ContainerInfo, Limits, SandboxSpec

log = logging.getLogger(__name__)
REFILL_DELAY_S = 0.05
"""Creating and starting a successor (~200 ms of engine work) waits this long after a run's result
is stored, so that the client gets the result first (same reason as docker.CLEANUP_DELAY_S)."""


class PoolEngine(Protocol):
    def create_pooled(self, spec: SandboxSpec, pool_class: str) -> str: ...

    def resize(self, container_id: str, held: Limits, wanted: Limits, full_weight: bool = False) -> None: ...

    def remove(self, container_id: str) -> None: ...

    def managed_containers(self, deployment: str) -> list[ContainerInfo]: ...


@dataclass(frozen=True)
class PoolClass:
    name: str
    """The language (with `@variant` and `:policy` when not the default); the containers' pool label."""
    template: SandboxSpec
    """What a pooled container is made from: image, command, the class's limits, labels."""
    floor: int
    """Warm containers kept however quiet the class is."""
    ceiling: int
    """Warm containers kept however busy it is."""

    def fits(self, spec: SandboxSpec) -> bool:
        held, wanted = self.template.limits, spec.limits
        return (
            spec.image == self.template.image
            and spec.command == self.template.command
            and (wanted.disk_mb, wanted.cpu_time_s, wanted.pids) == (held.disk_mb, held.cpu_time_s, held.pids)
            and (spec.runtime, spec.seccomp_deny) == (self.template.runtime, self.template.seccomp_deny)
            # A preloaded interpreter already holds its modules' memory: never shrink it below that.
            and (not self.template.preloads or wanted.memory_mb >= held.memory_mb)
        )


@dataclass(frozen=True)
class _Idle:
    id: str
    made_at: float


@dataclass(frozen=True)
class Sizing:
    """The operator's bounds on a worker's pool, besides each class's floor and ceiling."""

    window_s: float = 60.0
    """How far back arrivals count toward a class's target."""
    parallelism: int = 2
    """Containers created at once by the refill."""
    budget_mb: int = 1 << 20
    """Memory the warm containers on this engine (every worker of the deployment) may hold, each
    counted at its class's limit: this worker grows into what the others' leave."""
    refill_during_runs: bool = False
    """Refill while a run of this worker is in progress (otherwise between runs only)."""


class WarmPool:
    def __init__(
        self,
        engine: PoolEngine,
        classes: list[PoolClass],
        worker: str,
        deployment: str,
        max_idle_s: float,
        sizing: Sizing = Sizing(),
        on_take: Callable[[str, bool], None] = lambda name, hit: None,
        on_refill: Callable[[str, float], None] = lambda name, seconds: None,
        on_target: Callable[[str, int], None] = lambda name, target: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._classes = [c for c in classes if c.ceiling > 0]
        self._worker = worker
        self._deployment = deployment
        self._max_idle_s = max_idle_s
        self._sizing = sizing
        self._on_take = on_take
        self._on_refill = on_refill
        self._on_target = on_target
        self._clock = clock
        self._idle: dict[str, deque[_Idle]] = {c.name: deque() for c in self._classes}
        self._demand = {c.name: Demand(sizing.window_s, clock) for c in self._classes}
        self._running = 0
        self._others_mb = 0
        """What the other workers' warm containers on this engine hold (as of the last check)."""
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        """Notified when a creation ends and when the pool closes."""
        self._creating = 0
        self._closed = False
        """Set by drain(): nothing new is made, and a creation that ends after it removes its container."""
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, spec: SandboxSpec) -> str | None:
        """A started container for spec, sized to its limits, or None at once (the caller goes cold)."""
        pool_class = next((c for c in self._classes if c.fits(spec)), None)
        if pool_class is None:
            return None
        with self._lock:
            self._demand[pool_class.name].took(spec.submitted_at or None)
            idle = self._idle[pool_class.name]
            taken = idle.popleft() if idle else None
        self._on_take(pool_class.name, taken is not None)
        if taken is None:
            return None
        try:
            # A preloading container waited with the lowest CPU weight; the run gets the default.
            template = pool_class.template
            self._engine.resize(taken.id, template.limits, spec.limits, full_weight=template.preloads)
        except BaseException:
            self._engine.remove(taken.id)
            raise
        return taken.id

    def run_started(self) -> None:
        """A run of this worker began (pooled or not): no new refill starts until it ends."""
        with self._lock:
            self._running += 1

    def run_ended(self) -> None:
        with self._lock:
            self._running -= 1

    def refill(self) -> None:
        """Wake the refill loop shortly (the worker calls it once a run's result is stored)."""
        timer = threading.Timer(REFILL_DELAY_S, self._wake.set)
        timer.daemon = True
        timer.start()

    def run(self, stop: threading.Event) -> None:
        """The refill loop: fill after every take; look for dead, stale or surplus containers every few seconds."""
        check_s = min(5.0, self._max_idle_s / 2)
        next_check = 0.0
        delay = 0.0
        while not stop.is_set():
            try:
                checking = time.monotonic() >= next_check
                self.tick(stop, check=checking)
                if checking:
                    next_check = time.monotonic() + check_s
                delay = 0.0
            except Exception as exc:  # never dies: an engine error or a bug waits and tries again
                delay = min(max(delay * 2, 1.0), 30.0)
                message = exc.message if isinstance(exc, ServiceError) else repr(exc)
                log.warning("warm pool refill failed (%s); next try in %.0f s", message, delay,
                            exc_info=None if isinstance(exc, ServiceError) else exc)  # fmt: skip
            self._wake.wait(delay or check_s)
            self._wake.clear()

    def tick(self, stop: threading.Event, check: bool = True) -> None:
        """One round of the refill loop: with `check`, forget containers that died and remove those
        that waited longer than max_idle_s or stand above their class's target; then fill every
        class up to its target."""
        if check:
            self._forget_dead()
            self._recycle_stale()
            self._shed_surplus()
        self._fill(stop)

    def idle(self) -> dict[str, int]:
        """Containers waiting, per class."""
        with self._lock:
            return {name: len(idle) for name, idle in self._idle.items()}

    def targets(self) -> dict[str, int]:
        """What each class should hold now: its recent arrivals within its bounds and the budget."""
        with self._lock:
            wanted = [self._demand[c.name].target(c.floor, c.ceiling) for c in self._classes]
        floors = [min(c.floor, c.ceiling) for c in self._classes]
        memory = [c.template.limits.memory_mb for c in self._classes]
        granted = within_budget(wanted, floors, memory, self._sizing.budget_mb - self._others_mb)
        targets = {c.name: n for c, n in zip(self._classes, granted, strict=True)}
        for name, n in targets.items():
            self._on_target(name, n)
        return targets

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="warm-pool", daemon=True)
        self._thread.start()

    def drain(self, timeout_s: float = 10.0) -> None:
        """Close the pool and remove every idle container (a clean worker stop, after `stop` was set),
        returning within `timeout_s` whatever the engine does: creations still in flight are not waited
        for (each removes its own container when it ends), removals still running at the deadline are
        left to the reaper."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._closed = True
            self._settled.notify_all()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(left(deadline))  # it leaves its batch at once: the pool is closed
        with self._lock:
            taken = [item for idle in self._idle.values() for item in idle]
            for idle in self._idle.values():
                idle.clear()
        run_until(
            deadline, [functools.partial(self._engine.remove, item.id) for item in taken], "warm container removal"
        )

    def _fill(self, stop: threading.Event) -> None:
        """Create what the targets ask for, `parallelism` at a time, between runs."""
        while not stop.is_set():
            with self._lock:
                if self._closed or (self._running and not self._sizing.refill_during_runs):
                    return  # refill() after the run's result wakes the loop again
            targets = self.targets()
            idle = self.idle()
            batch: list[PoolClass] = []
            for pool_class in self._classes:
                missing = targets[pool_class.name] - idle[pool_class.name]
                batch.extend([pool_class] * max(0, missing))
            if not batch:
                return
            failures: list[BaseException] = []
            batch = batch[: self._sizing.parallelism]
            with self._lock:
                self._creating += len(batch)
            for pool_class in batch:
                # Daemon threads, not an executor's: an engine call blocked for its whole timeout must
                # never hold a stopping process (an executor's threads are joined at interpreter exit).
                threading.Thread(target=self._create, args=(pool_class, failures), name="warm-pool-create",
                                 daemon=True).start()  # fmt: skip
            with self._settled:
                self._settled.wait_for(lambda: self._creating == 0 or self._closed)
                if failures:
                    raise failures[0]  # after the batch: what the others made is in the pool

    def _create(self, pool_class: PoolClass, failures: list[BaseException]) -> None:
        began = time.monotonic()
        container_id: str | None = None
        try:
            container_id = self._engine.create_pooled(pool_class.template, pool_class.name)
        except BaseException as exc:
            failures.append(exc)
        seconds = time.monotonic() - began
        with self._settled:
            self._creating -= 1
            self._settled.notify_all()
            closed = self._closed
            if container_id is not None and not closed:
                self._demand[pool_class.name].refilled(seconds)
                self._idle[pool_class.name].append(_Idle(container_id, self._clock()))
        if container_id is None:
            return
        if not closed:
            self._on_refill(pool_class.name, seconds)
            return
        try:  # made after the stop emptied the pool: nobody else would remove it
            self._engine.remove(container_id)
        except Exception:
            log.exception("could not remove warm container %s made while stopping", container_id[:12])

    def _shed_surplus(self) -> None:
        """Remove the oldest containers above a class's target (its arrivals fell off)."""
        targets = self.targets()
        surplus: list[_Idle] = []
        with self._lock:
            for name, idle in self._idle.items():
                while len(idle) > targets[name]:
                    surplus.append(idle.popleft())
        for item in surplus:
            self._engine.remove(item.id)

    def _recycle_stale(self) -> None:
        cutoff = self._clock() - self._max_idle_s
        stale: list[_Idle] = []
        with self._lock:
            for idle in self._idle.values():
                while idle and idle[0].made_at < cutoff:
                    stale.append(idle.popleft())
        for item in stale:
            self._engine.remove(item.id)

    def _forget_dead(self) -> None:
        """Forget this worker's containers that died; note what the other workers' hold."""
        pooled = [c for c in self._engine.managed_containers(self._deployment) if c.running and c.pool is not None]
        alive = {c.id for c in pooled if c.worker == self._worker}
        others_mb = sum(c.pool_memory_mb for c in pooled if c.worker != self._worker)
        with self._lock:
            self._others_mb = others_mb
            for name, idle in self._idle.items():
                kept = deque(item for item in idle if item.id in alive)
                if len(kept) != len(idle):
                    log.warning("%d warm %s container(s) died while waiting; replacing", len(idle) - len(kept), name)
                self._idle[name] = kept
