"""Per-sandbox user ids: no two live sandboxes share a host uid.

The kernel keeps several limits per uid, not per container: inotify instances and watches, POSIX
message-queue bytes, pipe buffer pages, RLIMIT_NPROC. Sandboxes sharing one uid would share those
budgets, so one tenant exhausting them would break every other tenant's concurrent run. Each
sandbox therefore gets a uid of its own from a configured range, reserved before its container is
created and given back only after the container is removed.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Protocol

import redis

from execbox.core.redis import redis_errors, through_outage
from execbox.sandbox.errors import RuntimeUnavailable
from execbox.sandbox.keys import SandboxKeys

UID_HOLD_S = 4 * 3600
"""Longest a sandbox uid stays reserved when its worker died holding it (a warm container waits at
most max_idle_s, a run at most its timeout; both far below this)."""


class UidAllocator(Protocol):
    def reserve(self) -> int: ...

    def release(self, uid: int) -> None: ...


def parse_range(text: str) -> range:
    low, _, high = text.partition("-")
    first, last = int(low), int(high)
    if not 1000 <= first <= last < 2**31:
        raise ValueError(f"uid range {text!r}: give FIRST-LAST within 1000..2^31-1")
    return range(first, last + 1)


def _draw(uids: range, claim: Callable[[int], bool], attempts: int = 64) -> int:
    for _ in range(attempts):
        uid = uids[secrets.randbelow(len(uids))]
        if claim(uid):
            return uid
    raise RuntimeUnavailable(f"no free sandbox uid in {uids.start}-{uids.stop - 1} after {attempts} draws; "
                             "widen EXECBOX_DOCKER__UID_RANGE")  # fmt: skip


class LocalUids:
    """Distinct within this process (for one worker alone; the worker uses SharedUids)."""

    def __init__(self, uid_range: str) -> None:
        self._uids = parse_range(uid_range)
        self._held: set[int] = set()
        self._lock = threading.Lock()

    def _claim(self, uid: int) -> bool:
        with self._lock:
            if uid in self._held:
                return False
            self._held.add(uid)
            return True

    def reserve(self) -> int:
        return _draw(self._uids, self._claim)

    def release(self, uid: int) -> None:
        with self._lock:
            self._held.discard(uid)


class SharedUids:
    """Distinct across every worker of the deployment: reservations in Redis (SET NX, expiring
    on their own if a worker dies without giving them back)."""

    def __init__(self, uid_range: str, claim: Callable[[int], bool], give_back: Callable[[int], None]) -> None:
        self._uids = parse_range(uid_range)
        self._claim = claim
        self._give_back = give_back

    def reserve(self) -> int:
        return _draw(self._uids, self._claim)

    def release(self, uid: int) -> None:
        self._give_back(uid)


def redis_uids(client: redis.Redis, keys: SandboxKeys, uid_range: str, patience_s: float = 0.0) -> SharedUids:
    """SharedUids reserved in the deployment's Redis (key `uid:{uid}`). A reservation is tried
    again through a Redis outage of up to `patience_s` (a Sentinel fail-over): the run has not
    started, and failing it then would fail an execution a few seconds' wait would have run."""

    def claim(uid: int) -> bool:
        def once() -> bool:
            with redis_errors():
                return bool(client.set(keys.uid(uid), "1", nx=True, ex=UID_HOLD_S))

        return through_outage("reserving a sandbox uid", once, patience_s)

    def give_back(uid: int) -> None:
        with redis_errors():
            client.delete(keys.uid(uid))

    return SharedUids(uid_range, claim, give_back)


__all__ = ["LocalUids", "SharedUids", "UidAllocator", "parse_range", "redis_uids"]
