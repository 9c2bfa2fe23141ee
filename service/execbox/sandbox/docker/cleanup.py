"""Clean-up after a run, off the result's path: container and network removal a moment later."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from execbox.core.stopping import left, run_until

log = logging.getLogger(__name__)

CLEANUP_DELAY_S = 0.05
"""Removing a container (~50 ms of engine work) starts this long after the run, so that on a small
machine it does not compete with storing the result and answering the client (measured on 2 cores:
warm end-to-end p50 56 -> 36 ms)."""


class Deferred:
    """Clean-up actions run a moment after a run (off the result's path), or all at once by flush()
    when the worker stops, so that none is lost with the process. flush() returns by its timeout
    whatever the engine does: an action still running then is left to the reaper (containers and
    networks carry the worker's labels)."""

    def __init__(self, delay_s: float) -> None:
        self._delay_s = delay_s
        self._pending: dict[int, Callable[[], None]] = {}
        self._next = itertools.count()
        self._running = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def later(self, action: Callable[[], None]) -> None:
        with self._lock:
            key = next(self._next)
            self._pending[key] = action
        timer = threading.Timer(self._delay_s, self._run, args=(key,))
        timer.daemon = True
        timer.start()

    def _run(self, key: int) -> None:
        with self._lock:
            action = self._pending.pop(key, None)
            if action is None:
                return  # flush() took it
            self._running += 1
        try:
            action()
        except Exception:
            log.exception("sandbox clean-up failed; the reaper will retry")
        finally:
            with self._lock:
                self._running -= 1
                self._idle.notify_all()

    def flush(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            actions = list(self._pending.values())
            self._pending.clear()
        run_until(deadline, actions, "sandbox clean-up")  # each in its own thread, at once
        with self._lock:
            self._idle.wait_for(lambda: self._running == 0, left(deadline))
