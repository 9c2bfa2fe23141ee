"""Work a stopping process waits for only until a deadline: each action in a daemon thread of its own.

A process that stops must be gone within its grace whatever its clean-up is blocked in (an engine call
with a long timeout, a removal the engine is slow to answer). Actions run here never hold the process
past the deadline: what is still under way then is abandoned (a daemon thread does not keep the
interpreter alive), and whatever it was cleaning up is left to the sweep that finds it later (the
reaper, by its labels).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


def left(deadline: float) -> float:
    """Seconds until a `time.monotonic()` deadline, never negative."""
    return max(0.0, deadline - time.monotonic())


def run_until(deadline: float, actions: Sequence[Callable[[], object]], what: str) -> int:
    """Run `actions` at once, each in a daemon thread, and wait for them until `deadline`; how many
    were still running then (abandoned). A failure is logged, never raised."""

    def guarded(action: Callable[[], object]) -> None:
        try:
            action()
        except Exception:
            log.exception("%s failed while stopping; the reaper will find what it left", what)

    threads = [threading.Thread(target=guarded, args=(a,), name=f"stopping-{what}", daemon=True) for a in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(left(deadline))
    unfinished = sum(thread.is_alive() for thread in threads)
    if unfinished:
        log.warning("%d %s still under way at the stop deadline: abandoned to the reaper", unfinished, what)
    return unfinished


__all__ = ["left", "run_until"]
