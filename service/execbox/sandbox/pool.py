"""The warm pool: containers created and started ahead of time, each used for one run only.

A worker keeps, per pool class (a language with the limits that cannot change on a running
container: image, command, disk, CPU time, pids; network always none), up to `size` containers
that are already started with the full hardening and whose launcher waits for its frame on stdin.
A run whose spec fits a class takes one (memory and CPU are then set to the run's own values) and
the container is removed after that run like any other: never reused. A background thread refills
what runs took (once the run's result is stored, so that the engine's work on a successor does
not compete with the run for the CPU), recycles containers that waited longer than `max_idle_s`, and forgets containers
that died. An empty pool is not an error: the run creates its container on the spot (cold).

Pools are per worker process: a worker takes only containers it made, so a take is a pop under a
lock and two workers on one engine can never get the same container. Pool containers carry the
worker's name and the class in their labels; the reaper removes those whose worker is gone, and a
worker that stops cleanly removes its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from execbox.core.errors import ServiceError
from execbox.sandbox.runtime import ContainerInfo, Limits, RunSpec

log = logging.getLogger(__name__)
REFILL_DELAY_S = 0.05
"""Creating and starting a successor (~200 ms of engine work) waits this long after a run's result
is stored, so that the client gets the result first (same reason as docker.CLEANUP_DELAY_S)."""


class PoolEngine(Protocol):
    def create_pooled(self, spec: RunSpec, pool_class: str) -> str: ...

    def resize(self, container_id: str, held: Limits, wanted: Limits, full_weight: bool = False) -> None: ...

    def remove(self, container_id: str) -> None: ...

    def managed_containers(self, deployment: str) -> list[ContainerInfo]: ...


@dataclass(frozen=True)
class PoolClass:
    name: str
    """The language; also the value of the containers' pool label."""
    size: int
    template: RunSpec
    """What a pooled container is made from: image, command, the class's limits, labels."""

    def fits(self, spec: RunSpec) -> bool:
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


class WarmPool:
    def __init__(
        self,
        engine: PoolEngine,
        classes: list[PoolClass],
        worker: str,
        deployment: str,
        max_idle_s: float,
        on_take: Callable[[str, bool], None] = lambda language, hit: None,
        on_refill: Callable[[str, float], None] = lambda language, seconds: None,
    ) -> None:
        self._engine = engine
        self._classes = [c for c in classes if c.size > 0]
        self._worker = worker
        self._deployment = deployment
        self._max_idle_s = max_idle_s
        self._on_take = on_take
        self._on_refill = on_refill
        self._idle: dict[str, deque[_Idle]] = {c.name: deque() for c in self._classes}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, spec: RunSpec) -> str | None:
        """A started container for spec, sized to its limits, or None (the caller goes cold)."""
        pool_class = next((c for c in self._classes if c.fits(spec)), None)
        if pool_class is None:
            return None
        with self._lock:
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

    def refill(self) -> None:
        """Wake the refill loop shortly (the worker calls it once a run's result is stored)."""
        timer = threading.Timer(REFILL_DELAY_S, self._wake.set)
        timer.daemon = True
        timer.start()

    def run(self, stop: threading.Event) -> None:
        """The refill loop: fill after every take; look for dead or stale containers every few seconds."""
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
            except ServiceError as exc:
                delay = min(max(delay * 2, 1.0), 30.0)
                log.warning("warm pool refill failed (%s); next try in %.0f s", exc.message, delay)
            self._wake.wait(delay or check_s)
            self._wake.clear()

    def tick(self, stop: threading.Event, check: bool = True) -> None:
        """One round of the refill loop: with `check`, forget containers that died and remove those
        that waited longer than max_idle_s; then fill every class up to its size."""
        if check:
            self._forget_dead()
            self._recycle_stale()
        self._fill(stop)

    def idle(self) -> dict[str, int]:
        """Containers waiting, per class."""
        with self._lock:
            return {name: len(idle) for name, idle in self._idle.items()}

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop,), name="warm-pool", daemon=True)
        self._thread.start()

    def drain(self, timeout_s: float = 60.0) -> None:
        """Remove every idle container (a clean worker stop, after `stop` was set)."""
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # a container being created is in the pool before we empty it
        with self._lock:
            taken = [item for idle in self._idle.values() for item in idle]
            for idle in self._idle.values():
                idle.clear()
        for item in taken:
            self._engine.remove(item.id)

    def _fill(self, stop: threading.Event) -> None:
        for pool_class in self._classes:
            while not stop.is_set() and self._waiting(pool_class.name) < pool_class.size:
                began = time.monotonic()
                container_id = self._engine.create_pooled(pool_class.template, pool_class.name)
                self._on_refill(pool_class.name, time.monotonic() - began)
                with self._lock:
                    self._idle[pool_class.name].append(_Idle(container_id, time.monotonic()))

    def _waiting(self, name: str) -> int:
        with self._lock:
            return len(self._idle[name])

    def _recycle_stale(self) -> None:
        cutoff = time.monotonic() - self._max_idle_s
        stale: list[_Idle] = []
        with self._lock:
            for idle in self._idle.values():
                while idle and idle[0].made_at < cutoff:
                    stale.append(idle.popleft())
        for item in stale:
            self._engine.remove(item.id)

    def _forget_dead(self) -> None:
        alive = {
            c.id
            for c in self._engine.managed_containers(self._deployment)
            if c.running and c.worker == self._worker and c.pool is not None
        }
        with self._lock:
            for name, idle in self._idle.items():
                kept = deque(item for item in idle if item.id in alive)
                if len(kept) != len(idle):
                    log.warning("%d warm %s container(s) died while waiting; replacing", len(idle) - len(kept), name)
                self._idle[name] = kept
