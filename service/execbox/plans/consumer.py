"""Advancing runs from the execution event stream, in the API processes.

Each API process runs one thread that reads the outbox stream as the consumer group `plans`: a
terminal execution the dispatcher made for a run (its `origin`, checked by `awaited_by`) advances
that run. Entries a dead process took and never acknowledged are claimed by another after `idle_s`.
Between events the thread also advances runs whose retry, approval expiry or wall budget fell due
(`runs:active`). The executor runs here, in the API, because submitting executions is the API
role's right; workers, which sit next to untrusted code, gain nothing.
"""

from __future__ import annotations

import logging
import threading

from execbox.core.errors import ServiceError
from execbox.core.events import TERMINAL, consume
from execbox.executions.events import DURABLE_GROUPS
from execbox.executions.record import ExecutionRecord
from execbox.plans.dispatch import awaited_by
from execbox.plans.executor import Executor

log = logging.getLogger(__name__)
GROUP = DURABLE_GROUPS[1]
"""Per queue: `plans.<queue>` (deployments sharing a Redis each advance their own runs)."""


class PlanConsumer:
    def __init__(self, executor: Executor, name: str, idle_s: float) -> None:
        self._executor = executor
        self._events = executor.submissions.store.events
        self._name = name
        self._idle_s = idle_s
        self._group = f"{GROUP}.{executor.queue}"

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="plans", daemon=True)
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        consume(self._events, self._group, self.step, stop)

    def step(self, block_s: float = 0.5) -> None:
        """One round: runs that fell due, then execution events (blocking briefly for new ones)."""
        for run_id in self._executor.store.due():
            self._advance(run_id)
        for event_id, event in self._events.read(self._group, self._name, block_s=block_s, idle_s=self._idle_s):
            if event.get("type") == TERMINAL:
                record = self._executor.submissions.store.get(event["id"])
                if record is not None and not self._advance_for(record):
                    continue  # not acknowledged: claimed again after idle_s, so the run is not left behind
            self._events.ack(self._group, event_id)

    def _advance_for(self, record: ExecutionRecord) -> bool:
        """Advance the run the ended execution belongs to (its service link, checked: awaited_by)."""
        try:
            run_id = awaited_by(self._executor.store, record)
        except ServiceError as exc:
            log.warning("could not read the run of %s: %s", record.id, exc.message)
            return False
        except Exception:  # a broken run record must not stop every other run
            log.exception("reading the run of %s failed", record.id)
            return True
        return run_id is None or self._advance(run_id)

    def _advance(self, run_id: str) -> bool:
        """False when the run could not be advanced now (its lock is held by a process that may have
        died, or Redis failed): the caller leaves the event pending, to be claimed again."""
        try:
            self._executor.advance(run_id)
        except ServiceError as exc:
            log.warning("could not advance run %s: %s", run_id, exc.message)
            return False
        except Exception:  # one broken run must not stop every other run
            log.exception("advancing run %s failed", run_id)
        return True
