"""How many warm containers a pool class should hold: what the recent arrivals ask for, within the
operator's bounds.

A refill takes `refill_s` (create + start, and for a preloaded class the interpreter's imports).
Within one refill time nothing new arrives in the pool, so the pool must already hold as many
containers as runs arrive in such a span. The target is therefore the largest number of runs
taken (hits and misses alike) that arrived within any `refill_s`-long span of the last `window_s`
(arrival, not take, times: a busy worker takes a burst one run after another),
clamped to the class's [low, high]. An idle class falls back to `low` once its takes leave the
window; a burst raises the target at once. Pure logic: the pool feeds it, tests drive it with a clock.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

FIRST_REFILL_S = 0.3
"""The refill time assumed until one was measured (create + start on an idle engine)."""
_SMOOTHING = 0.3


class Demand:
    """One class's recent arrivals (Unix times) and refill times."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.time) -> None:
        self._window_s = window_s
        self._clock = clock
        self._takes: list[float] = []  # sorted: runs are taken in queue order, not always arrival order
        self.refill_s = FIRST_REFILL_S

    def took(self, arrived_at: float | None = None) -> None:
        """A take of a run that arrived at `arrived_at` (default: now)."""
        bisect.insort(self._takes, self._clock() if arrived_at is None else arrived_at)

    def refilled(self, seconds: float) -> None:
        self.refill_s += _SMOOTHING * (seconds - self.refill_s)

    def peak(self) -> int:
        """The most takes within any refill-time span of the window."""
        cutoff = self._clock() - self._window_s
        del self._takes[: bisect.bisect_left(self._takes, cutoff)]
        times = self._takes
        best = 0
        for i, began in enumerate(times):  # spans that start at a take
            best = max(best, bisect.bisect_right(times, began + self.refill_s, lo=i) - i)
        return best

    def target(self, low: int, high: int) -> int:
        return max(low, min(high, self.peak()))


def within_budget(wanted: Sequence[int], floors: Sequence[int], memory_mb: Sequence[int], budget_mb: int) -> list[int]:
    """Targets cut to a memory budget (each container counted at its memory limit, the most it can
    hold once a run takes it): every class keeps its floor; what is above a floor is granted one
    container at a time, round-robin across classes, while the budget lasts."""
    granted = list(floors)
    used = sum(n * mb for n, mb in zip(granted, memory_mb, strict=True))
    growing = True
    while growing:
        growing = False
        for i, want in enumerate(wanted):
            if granted[i] < want and used + memory_mb[i] <= budget_mb:
                granted[i] += 1
                used += memory_mb[i]
                growing = True
    return granted
