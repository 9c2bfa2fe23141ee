"""Advancing runs from the execution event stream, in the API processes.

Each API process runs one thread that reads the outbox stream as the consumer group `plans`: a
terminal execution the dispatcher made for a run (its `origin`, checked by `awaited_by`) advances
that run. Entries a dead process took and never acknowledged are claimed by another after `idle_s`.
Between events the thread also advances runs whose retry, approval expiry or wall budget fell due
(`runs:active`). An event or a due run that fails is retried with backoff and, after its last
attempt, set aside as a dead letter (execbox.core.poison): one broken run never stops the others.
A run whose lock another holder has is not a failure (it is made due again, uncounted), and a run
of another queue's deployment is never locked here: every deployment on a Redis sees every due
run, and their contending for its lock would starve, then set aside, its owner's.
The executor runs here, in the API, because submitting executions is the API
role's right; workers, which sit next to untrusted code, gain nothing.
"""

from __future__ import annotations

import logging
import threading
from functools import partial

from execbox.core.metrics import LoopMetrics
from execbox.core.poison import Guard, consume
from execbox.core.streams import TERMINAL
from execbox.executions.events import consumer_group
from execbox.plans.dispatch import awaited_by
from execbox.plans.errors import RunBusy
from execbox.plans.executor import Executor

log = logging.getLogger(__name__)


class PlanConsumer:
    def __init__(self, executor: Executor, name: str, idle_s: float, metrics: LoopMetrics | None = None) -> None:
        self._executor = executor
        self._events = executor.submissions.store.events
        self._name = name
        self._idle_s = idle_s
        self._group = consumer_group("plans", executor.queue)  # deployments sharing a Redis each advance their own runs
        store = executor.store
        self.guard = Guard(store.redis, store.keys, "plans", (store.keys.events, store.keys.active_runs), metrics)
        """A run or event that fails is retried with backoff, then set aside: it never holds the others up."""

    def run(self, stop: threading.Event) -> None:
        consume(self._events, self._group, self._name, self.handle, stop, self.guard, self._idle_s,
                before=self.advance_due)  # fmt: skip

    def advance_due(self) -> None:
        """Runs whose retry, approval expiry or wall budget fell due; one that fails is put back
        later (and set aside after its last attempt), so it never fills the due slots for ever."""
        active = self._executor.store.keys.active_runs
        for run_id in self._executor.store.due():
            # Set aside after its last attempt, the run ends failed (internal_error) if it still
            # reads, so its owner sees it ended instead of a run `running` for ever.
            self.guard.record(active, run_id, partial(self._advance, run_id), on_dead=partial(self._abandon, run_id))

    def handle(self, event: dict[str, str]) -> None:
        """An execution ended: advance the run it belongs to. A run another holder is changing is
        made due now (the due loop looks again, uncounted); raises when it cannot be done now for
        another reason (Redis failed, the run is unreadable): the guard tries the event again later."""
        if event.get("type") != TERMINAL:
            return
        record = self._executor.submissions.store.get(event["id"])
        if record is None:
            return
        try:
            run_id = awaited_by(self._executor.store, record, self._executor.queue)  # its service link, checked
        except RunBusy as busy:  # being changed: looked at again from the due set (it is this queue's run)
            self._executor.store.due_now(busy.run_id)
            return
        if run_id is not None:
            self._advance(run_id)

    def _advance(self, run_id: str) -> None:
        """Advance the run; while another holder changes it (RunBusy), it is made due now instead,
        uncounted: contention is not a poison, and the holder may have read the run before this
        event's execution ended, so it is looked at again."""
        try:
            self._executor.advance(run_id)
        except RunBusy:
            self._executor.store.due_now(run_id)

    def _abandon(self, run_id: str, why: str) -> None:
        self._executor.abandon(run_id, f"set aside after its last attempt: {why}")
