"""Poison-proof background loops: an item that fails is retried with backoff, then set aside; the loop goes on.

Every background consumer and periodic loop handles each stream entry and each due record through
its loop's `Guard`. A failure (any exception, not only a ServiceError) is logged with the item's id
and counted (`execbox_poison_total{loop}`); the item is tried again after an exponential backoff
(1 s, 2 s, 4 s, ...; the count is kept in Redis, so a restart or another process goes on counting),
and after `max_attempts` it is moved to the loop's dead-letter stream (`dead:{loop}`) and
acknowledged, or taken off its due set, so the items behind it are never held up. Operators
list, show, replay and drop dead letters with `execbox dead-letters` (execbox.core.deadletters);
a replay is queued on `replay:{loop}` and put back by the loop itself (the admin role needs no
right on the loops' own keys). `Loops` runs each loop in a thread and restarts one that died;
/readyz reads its state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import redis
from redis.exceptions import WatchError

from execbox.core.errors import ServiceError
from execbox.core.keys import LoopKeys
from execbox.core.metrics import LoopMetrics
from execbox.core.redis import redis_errors, text
from execbox.core.streams import EVENTS_MAXLEN, EventStream

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
COUNT_TTL_S = 24 * 3600
"""A failure count lapses a day after the item's last failure (items that later succeeded leave one)."""
DEAD_KEPT = 10_000
"""Dead letters kept per loop (the alert fires long before)."""
REPLAY_FOR = "replay_for"
"""A stream entry put back by a replay carries the one consumer group that is to handle it."""


@dataclass(frozen=True)
class DeadLetter:
    """An item a loop set aside: what it was, where it came from, why it failed."""

    loop: str
    kind: str
    """`entry` (a stream entry of a consumer group) or `record` (a member of a due set)."""
    item: str
    """The entry's id or the record's member (a run id, a schedule id, ...)."""
    source: str
    """The stream or sorted set it came from, and goes back to on replay."""
    error: str
    attempts: int
    at: float
    group: str = ""
    fields: dict[str, str] | None = None
    """An entry's fields (what a replay appends again)."""
    id: str = ""
    """Its id in the dead-letter stream."""

    def encode(self) -> dict[str, str]:
        return {"letter": json.dumps({k: v for k, v in asdict(self).items() if k != "id"})}

    @classmethod
    def decode(cls, letter_id: str, stored: dict[Any, Any]) -> DeadLetter:
        data = json.loads(text(stored.get(b"letter", stored.get("letter", "{}"))))
        return cls(**{**data, "id": letter_id})


def _describe(exc: BaseException) -> str:
    """The exception in a line or three (a validation error's first problems, not all of them)."""
    detail = exc.message if isinstance(exc, ServiceError) else str(exc)
    return f"{type(exc).__name__}: {' | '.join(detail.splitlines()[:3])}"[:500]


class Guard:
    """One loop's poison handling: runs an item's handler, and on failure backs off or sets it aside.

    `sources` are the streams and sorted sets the loop takes its items from: a replay goes back
    only to one of them.
    """

    def __init__(self, client: redis.Redis, keys: LoopKeys, loop: str, sources: tuple[str, ...] = (),
                 metrics: LoopMetrics | None = None, max_attempts: int = MAX_ATTEMPTS, backoff_s: float = BACKOFF_S,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.redis, self.keys, self.loop = client, keys, loop
        self.sources = sources
        self.metrics = metrics
        self.max_attempts, self.backoff_s = max_attempts, backoff_s
        self.clock = clock

    def backoff(self, attempt: int) -> float:
        """Seconds before the try after failed attempt number `attempt` (1, 2, 4, ... up to a minute)."""
        return float(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))

    # -- stream entries (consumer groups) ------------------------------------------------------

    def entry(
        self, stream: EventStream, group: str, consumer: str, entry_id: str, fields: dict[str, str],
        handle: Callable[[dict[str, str]], None], idle_s: float,
    ) -> bool:  # fmt: skip
        """Handle one entry a consumer read; True when it was acknowledged (handled, or set aside).

        A failed entry stays pending and is claimable again after its backoff (its idle time is set
        so that it reaches `idle_s` then), by this consumer or any other.
        """
        target = fields.get(REPLAY_FOR)
        if target is not None:
            if target != group:
                stream.ack(group, entry_id)  # a replay meant for another group
                return True
            fields = {k: v for k, v in fields.items() if k != REPLAY_FOR}
        try:
            handle(fields)
        except Exception as exc:
            attempts = self._failed(entry_id, exc)
            if attempts >= self.max_attempts:
                letter = DeadLetter(self.loop, "entry", entry_id, stream.key, _describe(exc), attempts, self.clock(),
                                    group=group, fields=fields)  # fmt: skip
                self._bury(letter, lambda pipe: pipe.xack(stream.key, group, entry_id))
                return True
            delay = self.backoff(attempts)
            if delay < idle_s:
                with redis_errors():
                    self.redis.xclaim(stream.key, group, consumer, 0, [entry_id],
                                      idle=int((idle_s - delay) * 1000), justid=True)  # fmt: skip
            return False
        stream.ack(group, entry_id)
        return True

    # -- due records (sorted sets of work by due time) -----------------------------------------

    def record(
        self,
        source: str,
        member: str,
        handle: Callable[[], None],
        taken: bool = False,
        on_dead: Callable[[str], object] | None = None,
    ) -> bool:
        """Handle one due member of the sorted set `source`; True when it was handled.

        On failure the member is put back `backoff` later (if it is still in the set; `taken`: the
        caller removed it to take it, so it is added again), and after max_attempts taken out of
        the set as a dead letter, so it is never first in line for ever; `on_dead` is then told why
        (so that what the record stands for can say it ended, rather than look alive for ever).
        """
        try:
            handle()
        except Exception as exc:
            attempts = self._failed(member, exc)
            if attempts >= self.max_attempts:
                letter = DeadLetter(self.loop, "record", member, source, _describe(exc), attempts, self.clock())
                self._bury(letter, lambda pipe: pipe.zrem(source, member))
                if on_dead is not None:
                    self.item(f"{member} (set aside)", partial(on_dead, letter.error))
            else:
                with redis_errors():
                    self.redis.zadd(source, {member: self.clock() + self.backoff(attempts)}, xx=not taken)
            return False
        with redis_errors():
            self.redis.delete(self._count_key(member))
        return True

    def item(self, name: str, handle: Callable[[], object]) -> bool:
        """Run one unit of a periodic loop's work that has no queue of its own to set it aside in
        (one session, one container): a failure is logged and counted, and the loop goes on."""
        try:
            handle()
        except Exception as exc:
            self.note(exc, name)
            return False
        return True

    # -- replays -------------------------------------------------------------------------------

    def replay(self, limit: int = 16) -> int:
        """Put back the dead letters an operator replayed (`execbox dead-letters replay`), in one
        transaction with taking them off the replay list (another process of the loop that took
        them first makes this one's transaction fail: each is put back once)."""
        queue = self.keys.replays(self.loop)
        letters: list[DeadLetter] = []
        with redis_errors(), self.redis.pipeline() as pipe:
            try:
                pipe.watch(queue)  # type: ignore[no-untyped-call]
                raws = [text(r) for r in pipe.lrange(queue, 0, limit - 1)]
                if not raws:
                    return 0
                pipe.multi()
                for raw in raws:
                    pipe.lrem(queue, 1, raw)
                    letter = _parse_replay(raw)
                    if letter is None or letter.source not in self.sources:
                        log.error("%s: replay of a dead letter from %s refused (not one of this loop's sources)",
                                  self.loop, letter.source if letter else "an unreadable entry")  # fmt: skip
                    elif letter.kind == "entry":
                        fields = {**(letter.fields or {}), REPLAY_FOR: letter.group}
                        pipe.xadd(letter.source, fields, maxlen=EVENTS_MAXLEN, approximate=True)  # type: ignore[arg-type]
                        letters.append(letter)
                    else:
                        pipe.zadd(letter.source, {letter.item: self.clock()})
                        pipe.delete(self._count_key(letter.item))
                        letters.append(letter)
                pipe.execute()
            except WatchError:
                return 0  # another process of this loop put them back
        for letter in letters:
            log.warning("%s: dead letter %s (%s) replayed", self.loop, letter.id, letter.item)
        return len(letters)

    # -- failures ------------------------------------------------------------------------------

    def _count_key(self, item: str) -> str:
        return self.keys.poison(self.loop, hashlib.sha256(item.encode()).hexdigest()[:32])

    def _failed(self, item: str, exc: Exception) -> int:
        """Count one failed attempt at `item` in Redis (shared by every process) and log it."""
        key = self._count_key(item)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.incr(key)
            pipe.expire(key, COUNT_TTL_S)
            attempts = int(pipe.execute()[0])
        self.note(exc, item, attempts)
        return attempts

    def note(self, exc: Exception, item: str, attempts: int | None = None) -> None:
        """Log and count a failure handling `item` (attempt number `attempts`, when counted)."""
        if self.metrics is not None:
            self.metrics.poison.labels(self.loop).inc()
        of = f" (attempt {attempts} of {self.max_attempts})" if attempts is not None else ""
        extra = {"loop": self.loop, "item": item[:200], "attempt": attempts}
        # The traceback once per item (its first failure), a line for each retry.
        trace = exc if attempts in (None, 1) and not isinstance(exc, ServiceError) else None
        log.error("%s: handling %s failed%s: %s", self.loop, item[:200], of, _describe(exc), exc_info=trace,
                  extra=extra)  # fmt: skip

    def _bury(self, letter: DeadLetter, release: Callable[[redis.client.Pipeline], object]) -> None:
        """Move the item to the dead letters and release it from its source, in one transaction."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.xadd(self.keys.dead_letters(self.loop), letter.encode(), maxlen=DEAD_KEPT, approximate=True)  # type: ignore[arg-type]
            release(pipe)
            pipe.delete(self._count_key(letter.item))
            letter_id = text(pipe.execute()[0])
        if self.metrics is not None:
            self.metrics.dead_letters.labels(self.loop).inc()
        log.error("%s: %s set aside as dead letter %s after %d attempts (%s); see `execbox dead-letters show %s %s`",
                  self.loop, letter.item[:200], letter_id, letter.attempts, letter.error, self.loop, letter_id,
                  extra={"loop": self.loop, "item": letter.item[:200]})  # fmt: skip


def _parse_replay(raw: str) -> DeadLetter | None:
    try:
        data = json.loads(raw)
        return DeadLetter(**data)
    except (ValueError, TypeError):
        return None


BLOCK_S = 0.5
"""How long a consumer's read waits for new entries when none is given; also how long its loop may
take to see that it was stopped (a blocking read is not interrupted)."""


def consume(
    stream: EventStream, group: str, consumer: str, handle: Callable[[dict[str, str]], None],
    stop: threading.Event, guard: Guard, idle_s: float, block_s: float | None = None,
    before: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """A consumer group's loop: each entry handled under `guard`, until `stop`.

    `before` runs at each round (a consumer's due work, guarded per record by its owner). While
    Redis is away the loop waits a second and starts over; anything else that escapes a round is
    logged and counted, and the loop goes on (a consumer never dies of one message or an outage).
    """
    while not stop.is_set():
        try:
            stream.ensure_group(group)
            while not stop.is_set():
                guard.replay()
                if before is not None:
                    before()
                waited = BLOCK_S if block_s is None else block_s
                for entry_id, fields in stream.read(group, consumer, block_s=waited, idle_s=idle_s):
                    guard.entry(stream, group, consumer, entry_id, fields, handle, idle_s)
        except ServiceError as exc:
            log.warning("consumer group %s: %s", group, exc.message)
            stop.wait(1.0)  # Redis is away: nothing to block on
        except Exception as exc:
            guard.note(exc, f"a round of group {group}")
            stop.wait(1.0)


@dataclass
class LoopState:
    running: bool = False
    restarts: int = 0
    last_error: str | None = None
    since: float = 0.0


class Loops:
    """This process's background loops, each in a thread of its own that restarts it if it dies."""

    def __init__(self, stop: threading.Event, names: Collection[str], metrics: LoopMetrics | None = None,
                 restart_s: float = 1.0, max_restart_s: float = 30.0) -> None:  # fmt: skip
        """`names`: the loops this process may start (`execbox.keyschema.LOOPS`: every room's), each
        one's metrics at zero from the start."""
        self.stop = stop
        self.names = frozenset(names)
        self.metrics = metrics
        if metrics is not None:
            metrics.initialise(sorted(self.names))
        self._restart_s, self._max_restart_s = restart_s, max_restart_s
        self._states: dict[str, LoopState] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self, name: str, run: Callable[[threading.Event], None]) -> threading.Thread:
        """Run `run(stop)` in a thread; if it raises, or returns before `stop`, run it again after a
        pause (1 s, doubling up to 30 s; back to 1 s once it ran for a minute)."""
        if name not in self.names:
            raise ValueError(f"unknown loop {name!r}: a room names its loops in its keys.py (LOOPS)")
        with self._lock:
            self._states[name] = LoopState()
            thread = threading.Thread(target=self._supervise, args=(name, run), name=name, daemon=True)
            self._threads[name] = thread
        thread.start()
        return thread

    def _supervise(self, name: str, run: Callable[[threading.Event], None]) -> None:
        state = self._states[name]
        pause = self._restart_s
        while not self.stop.is_set():
            state.running, state.since = True, time.time()
            try:
                run(self.stop)
                if self.stop.is_set():
                    break
                problem = "it returned while the process runs"
            except Exception as exc:
                problem = _describe(exc)
                log.exception("loop %s died; restarting it", name, extra={"loop": name})
            state.running, state.last_error = False, problem
            state.restarts += 1
            if self.metrics is not None:
                self.metrics.restarts.labels(name).inc()
            if time.time() - state.since > 60.0:
                pause = self._restart_s
            if self.stop.wait(pause):
                break
            pause = min(pause * 2, self._max_restart_s)
        state.running = False

    def status(self) -> dict[str, LoopState]:
        """Each loop's state; `running` is false while it waits to be restarted (or its thread is gone)."""
        with self._lock:
            return {name: LoopState(self._states[name].running and thread.is_alive(), self._states[name].restarts,
                                    self._states[name].last_error, self._states[name].since)
                    for name, thread in self._threads.items()}  # fmt: skip

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads.values()):
            thread.join(max(deadline - time.monotonic(), 0.0))


__all__ = ["BLOCK_S", "DeadLetter", "Guard", "LoopState", "Loops", "consume"]
