"""Creating and cancelling executions without HTTP: what the API, a scheduler or a plan executor calls.

`Submissions.submit` checks the request against the catalog (language, policy, runtime on offer,
webhook host), admits it under the tenant's quotas before any byte is stored, stores its input
files and the record, and queues it; every failure after admission gives the quota slot back.
Under an Idempotency-Key a retry gets the first execution instead of a second one.

Longer than 400 lines because accepting an execution is one sequence (catalog, effects and their
approval, admission, storage, queueing) whose failure paths must all give the quota slot back.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel
from rq import Queue

from execbox.catalog.errors import PolicyExceeded
from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet, runtime_problems
from execbox.catalog.schemas import AppliedPolicy, NetworkAllowlist
from execbox.catalog.webhook_hosts import host_allowed
from execbox.core.errors import ConflictError, FieldProblem, InvalidRequest, ServiceError
from execbox.core.readable import schema_problems
from execbox.core.schemacheck import schema_errors
from execbox.core.tracing import Spans, TraceContext, from_traceparent
from execbox.executions.effects import Approval, call_context, effect_problems, gate
from execbox.executions.errors import ExecutionNotFound
from execbox.executions.idempotency import IdempotencyKeys
from execbox.executions.inputs import prepare
from execbox.executions.queue import depth, enqueue, requeue
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, ExecutionError, Origin, Transition
from execbox.executions.settings import ExecutionsConfig
from execbox.executions.settle import approval_decided, reconciled
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.files.store import REDIS, FileStore
from execbox.fleet.registry import WorkerRegistry
from execbox.tenancy.quotas import Quotas

ExtraFiles = Sequence[tuple[str, bytes]]
"""Input files sent beside the JSON body (multipart parts): (path, bytes)."""


def new_execution_id() -> str:
    return "exe_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


ADDED_LATER = ("session_context", "effect", "idempotency", "approval")
"""Request fields added after digests were stored (idempotency keys last a day): left out while unset."""


def request_digest(body: BaseModel, extra: ExtraFiles = ()) -> str:
    """SHA-256 of a canonical request (any body model): the JSON body, then each multipart file's path
    and bytes."""
    canonical = body.model_dump(mode="json")
    for name in ADDED_LATER:  # unset, a field added later leaves the digests stored before it unchanged
        if canonical.get(name, 0) is None:
            del canonical[name]
    digest = hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode())
    for path, data in extra:
        digest.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


class Gate(Protocol):
    """Where approvals are kept (execbox.plans.approvals.ExecutionGate)."""

    def new_id(self) -> str:
        """An approval id, given to the execution before it is stored."""

    def request(self, record: ExecutionRecord, approval: Approval, required_by: str | None = None) -> None:
        """Keep a pending approval for the stored execution awaiting it (`record.approval_id`);
        `required_by` says why when the submitter did not ask for it (the operator's policy)."""


class Placement(Protocol):
    """Where executions naming a session go (execbox.sessions.service.Sessions)."""

    def policy(self, tenant: str, body: ExecutionCreate) -> AppliedPolicy:
        """The policy the execution runs with in its session; raises when it cannot run there."""

    def place(self, record: ExecutionRecord) -> None:
        """Queue the stored execution on its session."""


@dataclass(frozen=True)
class Submission:
    record: ExecutionRecord
    trace: TraceContext
    headers: dict[str, str]
    """RateLimit-* headers of the admission (none for an idempotent replay)."""
    replayed: bool = False
    """An Idempotency-Key retry: the execution the first request created."""


@dataclass(frozen=True)
class Submissions:
    settings: ExecutionsConfig
    store: ExecutionStore
    files: FileStore
    queue: Queue
    policies: PolicySet
    languages: Languages
    quotas: Quotas
    fleet: WorkerRegistry
    idempotency: IdempotencyKeys
    spans: Spans
    on_accept: Callable[[str], None] = lambda language: None
    """Told the language of each accepted execution (a metric)."""
    by: str = "api"
    """Who the queued transition is recorded as (api, scheduler, plan)."""
    sessions: Placement | None = None
    """Set where sessions are offered (the API); None refuses executions that name one."""
    gates: Gate | None = None
    """Set where approvals are offered (the API); None refuses executions that ask for one."""

    def submit(
        self,
        tenant: str,
        body: ExecutionCreate,
        extra: ExtraFiles = (),
        traceparent: str | None = None,
        idempotency_key: str | None = None,
        route: str = "POST /v1/executions",
        context: dict[str, str] | None = None,
        origin: Origin | None = None,
        approval_required: bool = False,
    ) -> Submission:
        """Accept one execution for tenant; raises a ServiceError (4xx/5xx) and stores nothing when
        refused. `context` travels with the record to the program (see ExecutionRecord.context);
        `origin` is the service's link to what started it (a script, a schedule's slot, a run's step),
        given only by the service's own submitters, never taken from a request. With
        `approval_required` (the submitting key's writes need approval), an execution with side
        effects (a write, or network access) waits for an approval whether or not it asks for one."""
        submission, _ = self.idempotency.once(
            tenant,
            route,
            idempotency_key,
            lambda: request_digest(body, extra),
            lambda: self._accept(
                tenant,
                body,
                extra,
                traceparent,
                call_context(body.idempotency, context, idempotency_key),
                origin,
                approval_required,
            ),
            lambda first: first.record.id,
            lambda execution_id: Submission(
                self.owned(tenant, execution_id), from_traceparent(traceparent), {}, replayed=True
            ),
        )
        replicas = self.settings.redis.accept_replicas
        if replicas:  # after the idempotency key is stored, so that a retry of a 503 finds this execution
            self.store.replicated(submission.record.id, replicas, self.settings.redis.accept_wait_ms)
        return submission

    def owned(self, tenant: str, execution_id: str) -> ExecutionRecord:
        """The execution as stored (reads change nothing: the sweeper settles expiries and lost
        workers); ExecutionNotFound when it is missing or another tenant's (never 403: no leak)."""
        return mine(self.store.get(execution_id), tenant, execution_id)

    def cancel(self, tenant: str, execution_id: str) -> ExecutionRecord:
        """Cancel a queued execution at once, or tell the worker running it to stop (the worker then
        records `cancelled`); ConflictError when it already ended."""

        def cancel_queued_record(record: ExecutionRecord) -> ExecutionStatus:
            record.cancel_requested = True
            ran = record.code_runs > 0  # queued again after an attempt whose outcome was unknown
            record.error = ExecutionError(
                category=ErrorCategory.CANCELLED,
                message="cancelled by the client while queued again after an attempt whose effect may have happened"
                if ran
                else "cancelled by the client before it started",
                retryable=False,
            )
            if ran and record.effect == "write":
                record.side_effects, record.phase = "possible", None
            return ExecutionStatus.CANCELLED

        record = self.owned(tenant, execution_id)
        waiting = {ExecutionStatus.QUEUED, ExecutionStatus.AWAITING_APPROVAL}
        if record.status in waiting:
            done = self.store.transition(execution_id, waiting, self.by, cancel_queued_record)
            if done is not None:  # its queue entry is skipped when a worker reaches it
                return done
            record = self.store.get(execution_id) or record
        if record.status is ExecutionStatus.RUNNING:
            self.store.signal(execution_id, "cancel")
            return record
        raise ConflictError(f"execution {execution_id} already ended as {record.status.value}; nothing to cancel")

    def _accept(
        self,
        tenant: str,
        body: ExecutionCreate,
        extra: ExtraFiles,
        traceparent: str | None,
        context: dict[str, str],
        origin: Origin | None,
        approval_required: bool = False,
    ) -> Submission:
        trace = from_traceparent(traceparent)
        with self.spans.span("execbox.api.create_execution", trace):
            return self._accept_traced(tenant, body, extra, trace, context, origin, approval_required)

    @staticmethod
    def _check_expect(body: ExecutionCreate) -> None:
        """Its outputs schema is checked as a plan's are: every `$ref` resolves inside it and every
        pattern runs on RE2 (the worker would otherwise fail the run after it ran)."""
        schema = body.expect.outputs_schema if body.expect is not None else None
        found = schema_problems(schema, "expect.outputs_schema") if schema is not None else []
        if found:
            raise InvalidRequest(f"expect.outputs_schema cannot be applied: {found[0].message}", tuple(found))

    def _check_effects(self, tenant: str, body: ExecutionCreate, policy: AppliedPolicy) -> None:
        found = effect_problems(body.effect, body.approval, isinstance(policy.network, NetworkAllowlist),
                                self.quotas.quota(tenant).declare_effects, self.gates is not None)  # fmt: skip
        check = body.idempotency.status_check if body.idempotency is not None else None
        if check is not None:  # it runs as the execution does: the same language, policy and size rules
            at = "idempotency.status_check"
            try:
                language = self.languages.get(check.language)
                self.policies.check_language(policy.name, language.name, f"{at}.language")
                self.policies.resolve(body.policy, len(check.code.encode()))
            except ServiceError as exc:
                found += [FieldProblem(f"{at}.{p.field}", p.message) for p in exc.problems] or [
                    FieldProblem(f"{at}.language", exc.message)
                ]
            found += schema_problems(check.expect, f"{at}.expect")
        if found:
            raise InvalidRequest("the execution's effect declarations are refused", tuple(found))

    def _queue(self, record: ExecutionRecord, trace: TraceContext) -> None:
        with self.spans.span("execbox.enqueue", trace, {"execution.id": record.id}):
            if self.sessions is not None and record.session is not None:
                self.sessions.place(record)
            else:
                backstop = self.policies.max_ceiling("timeout_s")
                enqueue(self.queue, record, trace.child().traceparent, self.settings, backstop)

    def decided(self, tenant: str, execution_id: str, approved: bool, why: str) -> ExecutionRecord | None:
        """Apply an approval's decision to the execution awaiting it: queued (approved), or failed
        without running (rejected); None when it no longer awaits one (decided before, or expired).
        Repeating it changes nothing, so a decision whose record was kept before a crash is applied
        again by the same decision."""

        done = self.store.transition(
            execution_id, {ExecutionStatus.AWAITING_APPROVAL}, self.by, approval_decided(tenant, approved, why)
        )
        if done is not None and done.status is ExecutionStatus.QUEUED:
            trace = TraceContext(done.trace_id, secrets.token_hex(8))
            if done.session is None:  # on the queue it was accepted on, whichever API decides
                requeue(
                    self.store.redis, done, trace.traceparent, self.settings, self.policies.max_ceiling("timeout_s")
                )
            else:
                self._queue(done, trace)
        return None if done is None or done.status is ExecutionStatus.EXPIRED else done

    def reconcile(
        self, tenant: str, execution_id: str, applied: bool, outputs: dict[str, Any], reason: str
    ) -> ExecutionRecord:
        """Settle an unknown outcome from the caller's evidence: succeeded (applied, with `outputs`)
        or failed (not applied: submit again, with the same key, to run it again)."""

        record = self.owned(tenant, execution_id)
        schema = record.expect.outputs_schema if record.expect is not None else None
        if applied and schema is not None:  # the outputs it claims must be ones the execution could have had
            unmet = sorted(e.message for e in schema_errors(schema, outputs))
            if unmet:
                raise InvalidRequest("the outputs do not meet the execution's expect.outputs_schema",
                                     tuple(FieldProblem("outputs", m) for m in unmet[:20]))  # fmt: skip
        done = self.store.transition(
            execution_id, {ExecutionStatus.UNKNOWN_OUTCOME}, self.by, reconciled(applied, outputs, reason)
        )
        if done is None:
            record = self.owned(tenant, execution_id)
            raise ConflictError(
                f"execution {execution_id} is {record.status.value}: it has no unknown outcome to settle"
            )
        return done

    def _check_webhook(self, body: ExecutionCreate) -> None:
        if body.webhook is not None and not host_allowed(body.webhook.url, self.settings.webhooks.allow_hosts):
            raise InvalidRequest(
                "the webhook's host is not one the operator allows (EXECBOX_WEBHOOKS__ALLOW_HOSTS)",
                (FieldProblem("webhook.url", "host not allowed for callbacks"),),
            )

    def _accept_traced(
        self,
        tenant: str,
        body: ExecutionCreate,
        extra: ExtraFiles,
        trace: TraceContext,
        context: dict[str, str],
        origin: Origin | None,
        approval_required: bool = False,
    ) -> Submission:
        language = self.languages.get(body.language)
        if body.session is not None:
            if self.sessions is None:
                raise InvalidRequest("sessions are not offered here", (FieldProblem("session", "not offered"),))
            policy = self.sessions.policy(tenant, body)
        else:
            policy = self.policies.resolve(body.policy, len(body.code.encode()))
            self.policies.check_language(policy.name, language.name)
        if policy.runtime not in (None, "runc"):
            problems = runtime_problems(policy, self.fleet.runtimes(), self.settings.docker.runsc_network_runtime)
            if problems:
                raise PolicyExceeded(tuple(problems))
        self._check_webhook(body)
        self._check_expect(body)
        self._check_effects(tenant, body, policy)
        now = time.time()
        approval, required_by = gate(body.approval, body.effect, isinstance(policy.network, NetworkAllowlist),
                                     approval_required, self.gates is not None)  # fmt: skip
        gated = approval is not None
        deadline = now + (approval.expires_in_s if approval is not None else policy.queue_timeout_s)
        status = ExecutionStatus.AWAITING_APPROVAL if gated else ExecutionStatus.QUEUED
        record_id = new_execution_id()
        # Quotas before any byte is stored: a refused request leaves nothing behind.
        admission = self.quotas.admit(tenant, policy.name, record_id, depth(self.queue))
        charge = None
        try:
            worst, data = worst_case(body, extra, policy, self.files)
            # Kept until its queue deadline, then retention_s (the record's and its input files' lifetime).
            charge = self.quotas.keep(tenant, worst + data, deadline - now + self.settings.retention_s,
                                      "this execution (inputs and output caps)")  # fmt: skip
            prepared = prepare(body, policy, language.file, self.files, list(extra),
                               keep_until=deadline + self.settings.retention_s, ttl_s=self.settings.retention_s,
                               tenant=tenant)  # fmt: skip
            record = ExecutionRecord(
                id=record_id,
                tenant=tenant,
                status=status,
                language=language.name,
                trace_id=trace.trace_id,
                labels=body.labels,
                origin=origin,
                created_at=now,
                policy=policy,
                code=body.code,
                env=body.env,
                files=prepared.files,
                stdin_b64=prepared.stdin_b64,
                inputs=body.inputs,
                outputs_spec=body.outputs,
                expect=body.expect,
                webhook=body.webhook,
                request_sha256=request_digest(body, extra),
                queue_deadline=deadline,
                queue=self.settings.queue.name,
                transitions=[Transition(status=status, at=now, by=self.by)],
                context=context,
                session=body.session,
                session_context=body.session_context,
                effect=body.effect,
                idempotency=body.idempotency,
                kept_bytes=worst,
                kept_bucket=charge.bucket,
            )
            if approval is not None:
                assert self.gates is not None
                record.approval_id = self.gates.new_id()
                self.store.create(record)  # then its approval: a crash between leaves one that expires unseen
                self.gates.request(record, approval, required_by)
            else:
                self.store.create(record)
                self._queue(record, trace)
        except BaseException:
            self.quotas.slots.release(tenant, record_id)
            if charge is not None:
                self.quotas.budget.settle(tenant, [(charge.bucket, -charge.bytes)])
            raise
        self.on_accept(language.name)
        return Submission(record, trace, admission.headers)


RECORD_OVERHEAD = 16 << 10
"""Bytes a record and its live events keep beside what the request and the output caps say: ids, policy,
transitions, status events."""


def worst_case(body: ExecutionCreate, extra: ExtraFiles, policy: AppliedPolicy, files: FileStore) -> tuple[int, int]:
    """(record, input file data): the most bytes an execution may keep in Redis, from its request and policy.
    The record holds code, env, stdin (base64), inputs and up to `output_bytes` of stdout and of stderr;
    its live events a second copy of that output. Input files are counted at their size (uploads named by
    id too: the execution keeps them as long as itself) when they are kept in Redis. Sizes beyond a cap are
    refused later (422)."""
    stdin = len(body.stdin_b64) * 3 // 4 if body.stdin_b64 is not None else len((body.stdin or "").encode())
    record = (
        len(body.code.encode())
        + sum(len(k) + len(v.encode()) for k, v in body.env.items())
        + 4 * -(-stdin // 3)
        + (len(json.dumps(body.inputs)) if body.inputs is not None else 0)
        + 4 * policy.output_bytes
        + RECORD_OVERHEAD
    )
    if files.blobs.kind != REDIS:  # the data goes to the object store, not Redis
        return record, 0
    data = sum(len(d) for _, d in extra)
    for item in body.files:
        if item.file_id is not None:
            meta = files.meta(item.file_id)
            data += meta.size if meta is not None else 0
        else:
            data += len(item.content_b64 or "") * 3 // 4
    return record, data


def mine(record: ExecutionRecord | None, tenant: str, execution_id: str) -> ExecutionRecord:
    """The record when it exists and is tenant's; ExecutionNotFound otherwise."""
    if record is None or record.tenant != tenant:
        raise ExecutionNotFound(execution_id)
    return record
