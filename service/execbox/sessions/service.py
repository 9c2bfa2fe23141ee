"""Opening, reading and ending sessions without HTTP, and placing executions on them.

`Sessions` is also the executions room's `Placement`: an execution naming a session is checked
here (the tenant's, not ended, same language, only its timeout set) and queued on the session's
own list instead of the shared queue.
"""

from __future__ import annotations

import base64
import math
import secrets
import time
from dataclasses import dataclass

from execbox.catalog.errors import PolicyExceeded
from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.catalog.schemas import AppliedPolicy, PolicyRequest
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.redis import redis_errors
from execbox.core.tracing import from_traceparent
from execbox.executions.inputs import prepare
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, ExecutionError
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.files.store import FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.sessions.errors import SessionEnded, SessionNotFound
from execbox.sessions.record import SessionRecord
from execbox.sessions.schemas import SessionCreate
from execbox.sessions.settings import SessionsConfig
from execbox.sessions.status import SessionEnd, SessionStatus
from execbox.sessions.store import SessionStore
from execbox.tenancy.errors import PolicyNotAllowed, RateLimited
from execbox.tenancy.quotas import Quotas


def new_session_id() -> str:
    return "ses_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def settle_waiting(
    store: SessionStore, executions: ExecutionStore, session_id: str, error: ExecutionError, by: str
) -> int:
    """Fail every execution still waiting in an ended session (they will never run); how many."""

    def fail(record: ExecutionRecord) -> ExecutionStatus:
        record.error = error
        return ExecutionStatus.CANCELLED if error.category is ErrorCategory.CANCELLED else ExecutionStatus.FAILED

    settled = 0
    for execution_id in store.drain(session_id):
        settled += executions.transition(execution_id, {ExecutionStatus.QUEUED}, by, fail) is not None
    return settled


def ended_error(record: SessionRecord) -> ExecutionError:
    """What an execution that the session's end kept from running is told."""
    if record.end_reason is SessionEnd.DELETED:
        return ExecutionError(
            category=ErrorCategory.CANCELLED,
            message=f"session {record.id} was deleted before this ran",
            retryable=False,
        )
    why = record.error.message if record.error else f"it ended ({record.end_reason})"
    return ExecutionError(
        category=ErrorCategory.SANDBOX_ERROR,
        message=f"session {record.id} ended before this ran: {why}; open a new session",
        retryable=False,
        details={"session": record.id, "end_reason": str(record.end_reason)},
    )


@dataclass(frozen=True)
class Sessions:
    settings: SessionsConfig
    store: SessionStore
    executions: ExecutionStore
    files: FileStore
    languages: Languages
    policies: PolicySet
    quotas: Quotas
    fleet: WorkerRegistry | None = None
    """Where the fleet's session slots are read (None: not bounded by them)."""

    def open(self, tenant: str, body: SessionCreate, traceparent: str | None = None) -> SessionRecord:
        language = self.languages.get(body.language)
        if language.session is None:
            with_sessions = [lang.name for lang in self.languages if lang.session is not None]
            raise InvalidRequest(
                f"language {language.name!r} has no session kernel",
                (FieldProblem("language", f"sessions are offered for: {', '.join(with_sessions) or 'none'}"),),
            )
        policy = self.policies.resolve(body.policy, 0)
        self.policies.check_language(policy.name, language.name)
        problems = []
        if policy.network != "none":
            problems.append(FieldProblem("policy.network", "a session runs without network; use `none`"))
        if policy.runtime not in (None, "runc"):
            problems.append(FieldProblem("policy.runtime", "sessions run under runc only in this version"))
        ceilings = self.settings.sessions
        if body.idle_timeout_s > ceilings.max_idle_timeout_s:
            problems.append(
                FieldProblem("idle_timeout_s", f"above the operator's ceiling {ceilings.max_idle_timeout_s}")
            )
        if body.max_lifetime_s > ceilings.max_lifetime_s:
            problems.append(FieldProblem("max_lifetime_s", f"above the operator's ceiling {ceilings.max_lifetime_s}"))
        if problems:
            raise PolicyExceeded(tuple(problems))
        quota = self.quotas.quota(tenant)
        if policy.name not in quota.policies:
            raise PolicyNotAllowed(tenant, policy.name, quota.policies)
        session_id = new_session_id()
        self._admit(tenant, session_id, quota.sessions, quota.session_share)
        try:
            now = time.time()
            prepared = prepare(
                ExecutionCreate(language=language.name, code="-", files=body.files), policy, language.file,
                self.files, [], keep_until=now + body.max_lifetime_s, ttl_s=self.settings.retention_s, tenant=tenant,
            )  # fmt: skip
            record = SessionRecord(
                id=session_id,
                tenant=tenant,
                status=SessionStatus.STARTING,
                language=language.name,
                labels=body.labels,
                created_at=now,
                expires_at=min(now + body.idle_timeout_s, now + body.max_lifetime_s),
                idle_timeout_s=body.idle_timeout_s,
                max_lifetime_s=body.max_lifetime_s,
                last_activity_at=now,
                policy=policy,
                env=body.env,
                files=prepared.files,
                trace_id=from_traceparent(traceparent).trace_id,
            )
            self.store.create(record, self.settings.queue.name)
        except BaseException:
            self.store.release(tenant, session_id)
            raise
        return record

    def _admit(self, tenant: str, session_id: str, quota: int, share: float) -> None:
        """Take a slot of the tenant's and one of the fleet's, or refuse at once (429) naming the limit.

        A session holds a worker's slot for its whole life, idle or not, so a tenant may hold only
        its share of the slots the other tenants leave (however high its quota): with a share of
        half, a tenant at its limit leaves at least as many slots free as it holds, so no two
        tenants fill the fleet, and a full fleet is refused now rather than left `starting`."""
        capacity = self.fleet.session_capacity(self.settings.queue.name) if self.fleet is not None else None
        limit, others = quota, 0
        if capacity is not None:
            others = max(len(self.store.live()) - self._open_of(tenant), 0)
            limit = min(quota, max(1, math.floor((capacity - others) * share)))
        verdict = self.store.admit(tenant, session_id, limit, capacity)
        if verdict == "tenant":
            held = f" less the {others} other tenants hold" if others else ""
            why = (
                "its quota"
                if limit == quota
                else f"its share ({share:.0%}) of the fleet's {capacity} session slots{held}"
            )
            raise RateLimited(
                f"tenant {tenant!r} has {limit} sessions open, {why}; end one it no longer uses "
                "(DELETE /v1/sessions/{id}) and retry",
                headers={"Retry-After": "5"},
            )
        if verdict == "fleet":
            raise RateLimited(
                f"every session slot of the fleet is taken ({capacity}: workers x EXECBOX_SESSIONS__PER_WORKER); "
                "retry later, end a session you no longer use, or ask the operator for more workers",
                headers={"Retry-After": "10"},
            )

    def _open_of(self, tenant: str) -> int:
        """How many sessions the tenant holds now (admitted and not ended)."""
        with redis_errors():
            return int(self.store.redis.zcard(self.store.keys.open_sessions(tenant)))

    def owned(self, tenant: str, session_id: str) -> SessionRecord:
        record = self.store.get(session_id)
        if record is None or record.tenant != tenant:
            raise SessionNotFound(session_id)
        return record

    def list(self, tenant: str, status: SessionStatus | None = None) -> list[SessionRecord]:
        return [r for r in self.store.of_tenant(tenant) if status is None or r.status is status]

    def delete(self, tenant: str, session_id: str) -> SessionRecord:
        """End the session now (its holder removes the sandbox at once); its waiting executions are
        cancelled. Deleting an ended session answers its record."""
        record = self.owned(tenant, session_id)
        ended = self.store.end(session_id, SessionEnd.DELETED)
        if ended is None:
            return self.store.get(session_id) or record
        settle_waiting(self.store, self.executions, session_id, ended_error(ended), "api")
        return ended

    def end_in(self, tenant: str, session_id: str, seconds: int) -> SessionRecord:
        """End the session `seconds` from now, sooner or later than it would have (its holder reads
        the new lifetime within a second). Above the operator's lifetime ceiling: 422, unchanged."""
        record = self.owned(tenant, session_id)
        ceiling = self.settings.sessions.max_lifetime_s
        lifetime = math.ceil(time.time() + seconds - record.created_at) if seconds <= ceiling else seconds
        if lifetime > ceiling:
            why = f"the session would live {lifetime} s, above the operator's ceiling {ceiling} s"
            raise PolicyExceeded((FieldProblem("timeout", why),))

        def change(r: SessionRecord) -> bool:
            r.max_lifetime_s = lifetime
            r.expires_at = r.deadline()
            return True

        updated = self.store.update(session_id, change)
        if updated is None:
            raise SessionEnded(f"session {session_id} ended ({record.end_reason}); open a new one")
        return updated

    # Placement (execbox.executions.submit)
    def policy(self, tenant: str, body: ExecutionCreate) -> AppliedPolicy:
        """The policy an execution in body.session runs with; raises when it cannot run there."""
        assert body.session is not None
        record = self.owned(tenant, body.session)
        if record.status is SessionStatus.ENDED:
            raise SessionEnded(f"session {record.id} ended ({record.end_reason}); open a new one")
        problems = []
        language = self.languages.get(body.language)
        if language.name != record.language:
            problems.append(FieldProblem("language", f"session {record.id} runs {record.language}"))
        context = (body.session_context or language.base).split(":", 1)[0]
        if context != language.base and context not in language.contexts:
            offered = sorted({language.base, *language.contexts})
            problems.append(
                FieldProblem("session_context", f"{language.name} sessions offer {offered}, not {context!r}")
            )
        set_limits = body.policy.model_dump(exclude_none=True, exclude={"timeout_s"})
        if set_limits:
            problems.append(FieldProblem("policy", f"in a session only timeout_s may be set, not {sorted(set_limits)}"))
        if body.stdin is not None or body.stdin_b64 is not None:
            problems.append(FieldProblem("stdin", "a session's interpreter reads no stdin"))
        if body.outputs.files:
            problems.append(FieldProblem("outputs.files", "in a session the artifacts are what the call wrote in out/"))
        if problems:
            raise InvalidRequest("this execution cannot run in that session", tuple(problems))
        timeout = record.policy.timeout_s
        if body.policy.timeout_s is not None:
            timeout = self.policies.resolve(
                PolicyRequest(name=record.policy.name, timeout_s=body.policy.timeout_s), 0
            ).timeout_s
        return record.policy.model_copy(update={"timeout_s": timeout})

    def place(self, record: ExecutionRecord) -> None:
        assert record.session is not None
        self.store.push(record.session, record.id)
        session = self.store.get(record.session)
        if session is not None and session.status is SessionStatus.ENDED:  # it ended as the id was pushed
            settle_waiting(self.store, self.executions, session.id, ended_error(session), "api")
