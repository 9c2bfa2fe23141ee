"""Holding sessions in a worker: take new sessions while there is room, hold each in a thread of its own.

A held session's thread opens its sandbox behind the same seam as a one-shot run
(`SandboxRunner.open_session`), marks the session ready, then waits on the session's own list and runs
each execution as a call in the kernel through the execution lifecycle itself
(execbox.executions.lifecycle: taken, running, outcome, stored, announced; only "where it runs"
differs), renewing the session's lease all along. It
ends the session when it is deleted, idle past its timeout, past its lifetime, or when the sandbox
is lost, and removes the container whatever happens. A worker that dies takes its sessions with
it: the reaper ends them (`worker_lost`) once their lease lapses, and removes the containers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from secrets import token_hex
from typing import Protocol

from execbox.core import logs, poison
from execbox.core.errors import ServiceError
from execbox.core.tracing import TraceContext
from execbox.executions.lifecycle import Worker, run_and_finish, run_limits, take
from execbox.files.archive import input_archive
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec, SessionSandbox
from execbox.sessions.record import SessionRecord
from execbox.sessions.relay import Relay
from execbox.sessions.service import ended_error, settle_waiting
from execbox.sessions.settings import SessionsConfig
from execbox.sessions.status import SessionEnd, SessionStatus
from execbox.sessions.store import WAKE, SessionStore

log = logging.getLogger(__name__)


class SessionWorker(Worker, Protocol):
    """What holding sessions needs of the worker beyond the lifecycle's own (the sessions' store and settings)."""

    @property
    def sessions(self) -> SessionStore: ...
    @property
    def settings(self) -> SessionsConfig: ...


@dataclass
class _Held:
    """What a session's lease keeper may stop: the sandbox, and the call running in it."""

    sandbox: SessionSandbox | None = None
    control: SandboxControl | None = None


class SessionHost:
    def __init__(self, ctx: SessionWorker, paused: Callable[[], bool] = lambda: False) -> None:
        """`paused`: asked before taking each new session (a drained node takes none); held ones go on."""
        self.ctx = ctx
        self._paused = paused
        self.store: SessionStore = ctx.sessions
        self._held: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def run(self, stop: threading.Event) -> None:
        """The intake loop (under the worker's loop supervisor)."""
        self._stop = stop
        self._intake()

    def _intake(self) -> None:
        capacity = self.ctx.settings.sessions.per_worker
        while not self._stop.is_set():
            if self.held >= capacity or self._paused():
                self._stop.wait(0.5)
                continue
            try:
                session_id = self.store.next_start(self.ctx.settings.queue.name, poison.BLOCK_S)
            except ServiceError as exc:
                log.warning("session intake: %s", exc.message)
                self._stop.wait(1.0)
                continue
            except Exception:  # the intake never dies (each held session has its own thread and guard)
                log.exception("session intake failed")
                self._stop.wait(1.0)
                continue
            if session_id is None:
                continue
            thread = threading.Thread(target=self._hold, args=(session_id,), name=f"session-{session_id}", daemon=True)
            with self._lock:
                self._held[session_id] = thread
            thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the held sessions to close (the worker is stopping, its `stop` set): each is woken
        from its wait for a next call, so that it ends now rather than when that wait runs out."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            held = dict(self._held)
        for session_id in held:
            try:
                self.store.wake(session_id)
            except ServiceError as exc:  # it ends at its wait's end instead
                log.warning("session %s: could not wake its holder: %s", session_id, exc.message)
        for thread in held.values():
            thread.join(max(deadline - time.monotonic(), 0.0))

    def _hold(self, session_id: str) -> None:
        try:
            with logs.bound(None, None):
                self._serve(session_id)
        except Exception:
            log.exception("session %s: unexpected failure", session_id)
            self._end(session_id, SessionEnd.SANDBOX_ERROR, "the worker holding it failed unexpectedly")
        finally:
            with self._lock:
                self._held.pop(session_id, None)

    def _serve(self, session_id: str) -> None:
        ctx = self.ctx
        lease_s = ctx.settings.worker.lease_s

        def claim(record: SessionRecord) -> bool:
            if record.status is not SessionStatus.STARTING or record.worker is not None:
                return False
            record.worker = ctx.name
            return True

        self.store.renew_lease(session_id, ctx.name, lease_s)
        record = self.store.update(session_id, claim)
        if record is None:
            return  # deleted before a worker took it
        renewing = threading.Event()
        held = _Held()
        renewer = threading.Thread(target=self._renew, args=(session_id, renewing, held), daemon=True)
        renewer.start()
        sandbox: SessionSandbox | None = None
        try:
            try:
                sandbox = ctx.runtime.open_session(
                    self._spec(record), session_id, ctx.settings.sessions.start_timeout_s
                )
            except ServiceError as exc:
                self._end(session_id, SessionEnd.SANDBOX_ERROR, f"its sandbox could not start: {exc.message}")
                return

            def ready(r: SessionRecord) -> bool:
                """Idle time counts from here: a start slower than the idle timeout (a busy host)
                must not end the session before its first call, which may already wait."""
                r.status, r.ready_at = SessionStatus.READY, time.time()
                r.last_activity_at, r.expires_at = r.ready_at, r.deadline()
                return True

            held.sandbox = sandbox
            if self.store.update(session_id, ready) is None:
                return  # deleted while starting
            log.info("session %s ready", session_id)
            relay = Relay(self.store, session_id, sandbox, ctx.metrics.loops.poison.labels("sessions").inc)
            relaying = threading.Thread(target=relay.run, args=(renewing,), name=f"ops-{session_id}", daemon=True)
            relaying.start()
            self._loop(session_id, sandbox, held)
        finally:
            renewing.set()
            if sandbox is not None:
                sandbox.close()
            ended = self.store.get(session_id)
            if ended is not None and ended.status is SessionStatus.ENDED:
                settle_waiting(self.store, ctx.store, session_id, ended_error(ended), ctx.name)

    def _loop(self, session_id: str, sandbox: SessionSandbox, held: _Held) -> None:
        ctx = self.ctx
        while True:
            record = self.store.get(session_id)
            if record is None or record.status is SessionStatus.ENDED or record.worker != ctx.name:
                return
            now = time.time()
            if now >= record.created_at + record.max_lifetime_s:  # before `gone`: the lease keeper sets it then
                self._end(session_id, SessionEnd.MAX_LIFETIME, None)
                return
            if sandbox.gone is not None:  # lost between calls (a request it did not take, a line too long)
                self._end(session_id, SessionEnd.SANDBOX_ERROR, sandbox.gone)
                return
            if now >= record.last_activity_at + record.idle_timeout_s:
                self._end(session_id, SessionEnd.IDLE_TIMEOUT, None)
                return
            if self._stop.is_set():
                self._end(session_id, SessionEnd.SANDBOX_ERROR, "its worker stopped; the state is lost")
                return
            execution_id = self.store.pop(session_id, min(record.deadline() - now, 1.0))
            if execution_id is None or execution_id == WAKE:
                continue
            self._call(session_id, sandbox, execution_id, held)
            if sandbox.gone is not None:
                self._end(session_id, SessionEnd.SANDBOX_ERROR, sandbox.gone)
                return

    def _call(self, session_id: str, sandbox: SessionSandbox, execution_id: str, held: _Held) -> None:
        ctx = self.ctx

        def busy(record: SessionRecord) -> bool:
            record.running = execution_id
            return True

        logs.bind(None, execution_id)
        started = take(ctx, execution_id)
        if started is None:
            return
        logs.bind(started.trace_id, execution_id)
        self.store.update(session_id, busy)
        held.control = SandboxControl()
        settled: list[bool] = []

        def settle(outcome: SandboxOutcome | None) -> None:
            """The call is over: the session says so before the call's result is stored, so a
            client that has the result reads the session idle and counted."""

            def idle(record: SessionRecord) -> bool:
                record.running = None
                record.executions += 1
                record.last_activity_at = time.time()
                record.expires_at = record.deadline()
                record.kernel_restarts += bool(outcome is not None and outcome.kernel_restarted)
                return True

            if not settled:
                settled.append(True)
                self.store.update(session_id, idle)

        try:
            trace = TraceContext(started.trace_id, token_hex(8))
            run_and_finish(ctx, started, trace, session=sandbox, control=held.control, before_store=settle)
        finally:
            held.control = None
            settle(None)  # when the call failed before its result was stored
            logs.bind(None, None)

    def _renew(self, session_id: str, stop: threading.Event, held: _Held) -> None:
        """Keep the lease while the session is held, and hold its lifetime whatever the sandbox does
        (control C51): at its end the session ends and its container is removed, even in the middle
        of a call that does not return (a supervisor stopped by its own code). When the session is
        ended from outside (DELETE) while a call runs, cancel the call and remove the sandbox at once."""
        lease_s = self.ctx.settings.worker.lease_s
        wait = max(lease_s / 3, 0.2)
        while not stop.wait(wait):
            wait = max(lease_s / 3, 0.2)
            try:
                self.store.renew_lease(session_id, self.ctx.name, lease_s)
                record = self.store.get(session_id)
                if record is not None and record.status is not SessionStatus.ENDED:
                    left = record.created_at + record.max_lifetime_s - time.time()
                    if left <= 0 and held.sandbox is not None:
                        why = f"session {session_id} reached its lifetime ({record.max_lifetime_s} s) during this call"
                        # Ended first: the holder's loop reads a lost sandbox (gone) as sandbox_error,
                        # and must find the session already ended for its lifetime when it looks.
                        self._end(session_id, SessionEnd.MAX_LIFETIME, None)
                        held.sandbox.gone = held.sandbox.gone or f"{why}; open a new session"
                        record = self.store.get(session_id)
                    wait = min(wait, max(left, 0.05))
            except ServiceError as exc:
                log.warning("session lease renewal failed: %s", exc.message)
                continue
            if record is not None and record.status is SessionStatus.ENDED and held.sandbox is not None:
                control = held.control
                if control is not None and record.end_reason is not SessionEnd.MAX_LIFETIME:
                    control.cancel()
                held.sandbox.close()
                return

    def _end(self, session_id: str, reason: SessionEnd, why: str | None) -> None:
        if self.store.end(session_id, reason, why, worker=self.ctx.name) is not None:
            log.info("session %s ended: %s", session_id, reason.value)

    def _spec(self, record: SessionRecord) -> SandboxSpec:
        ctx = self.ctx
        language = ctx.languages.get(record.language)
        assert language.session is not None
        env = {**dict(language.env), **record.env, "EXECBOX_OUTPUT_DIR": "/workspace/out",
               "EXECBOX_SESSION_ID": record.id}  # fmt: skip
        return SandboxSpec(
            execution_id="",
            trace_id=record.trace_id,
            worker=ctx.name,
            image=language.image,
            command=language.session,
            files=(),
            env=tuple(sorted(env.items())),
            limits=run_limits(record.policy),
            language=language.name,
            deployment=ctx.settings.redis.key_prefix,
            input_archive=input_archive(ctx.files, record.files) if record.files else None,
            runtime="runc",
            seccomp_deny=tuple(record.policy.seccomp_deny),
        )
