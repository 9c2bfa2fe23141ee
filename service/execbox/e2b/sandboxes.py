"""E2B sandboxes as execbox sessions, without HTTP: create, connect, list, read, time out, kill,
and the access check of every in-sandbox call.

A sandbox id is its session id without the `ses_` prefix (26 lowercase base32 characters, so it
can be a DNS label in E2B's `{port}-{id}.{domain}` form). Each create or connect hands out a fresh
access token; only their SHA-256 digests are stored (`e2b:{id}`), so a token is shown once and a
leaked Redis dump opens no sandbox. In-sandbox calls carry only the token and the id, never the API
key: the token names the sandbox, the sandbox names its tenant."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl, unquote

import redis
from pydantic import BaseModel, Field, ValidationError

from execbox.catalog.schemas import PolicyRequest
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.redis import redis_errors
from execbox.e2b.errors import BadAccessToken, SandboxNotFound
from execbox.e2b.keys import E2bKeys
from execbox.e2b.schemas import UNSUPPORTED_CREATE, ConnectSandbox, NewSandbox, Sandbox, SandboxDetail, problems
from execbox.e2b.settings import E2bSettings
from execbox.sessions.errors import SessionNotFound
from execbox.sessions.record import SessionRecord
from execbox.sessions.schemas import SessionCreate
from execbox.sessions.service import Sessions
from execbox.sessions.status import SessionStatus

PREFIX = "ses_"
SANDBOX_ID = re.compile(r"[a-z2-7]{26}")
"""A sandbox id as this server makes them; anything else names no sandbox and reaches no key."""
MAX_TOKENS = 16
"""Tokens kept per sandbox (one per create or connect); the oldest is forgotten beyond this."""


class SandboxEntry(BaseModel):
    """What a sandbox adds to its session (stored at `e2b:{id}`)."""

    tenant: str
    template: str
    tokens: list[str] = Field(default_factory=list, description="SHA-256 digests of its access tokens, hex.")


@dataclass(frozen=True)
class Opened:
    """An in-sandbox caller's sandbox: its session as stored now, and the entry the token matched."""

    session: SessionRecord
    entry: SandboxEntry

    @property
    def running(self) -> bool:
        return self.session.status is not SessionStatus.ENDED


def session_id(sandbox_id: str) -> str:
    return PREFIX + sandbox_id


def sandbox_id(session_id: str) -> str:
    return session_id.removeprefix(PREFIX)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK's `metadata` query value, decoded once by the server: a form string whose keys and
    values were quoted once more (e2b/sandbox_sync/paginator.py)."""
    if not raw:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


class Sandboxes:
    def __init__(self, settings: E2bSettings, sessions: Sessions, client: redis.Redis, keys: E2bKeys,
                 retention_s: int) -> None:  # fmt: skip
        self.settings, self.sessions, self.redis, self.keys = settings, sessions, client, keys
        self._ttl_s = sessions.settings.sessions.max_lifetime_s + retention_s

    # the control plane (the caller's tenant comes from its API key)
    def create(self, tenant: str, body: NewSandbox, traceparent: str | None) -> Sandbox:
        refused = [FieldProblem(name, "not offered by this server (docs/e2b.md)")
                    for name in sorted(body.model_extra or {}) if name in UNSUPPORTED_CREATE]  # fmt: skip
        if body.allow_internet_access:
            refused.append(FieldProblem("allow_internet_access", "sandboxes here have no network (docs/e2b.md)"))
        template = self.settings.templates.get(body.templateID)
        if template is None:
            offered = ", ".join(sorted(self.settings.templates))
            refused.append(FieldProblem("templateID", f"no template {body.templateID[:64]!r}; offered: {offered}"))
        if refused:
            raise InvalidRequest("this sandbox cannot be created here", tuple(refused))
        assert template is not None
        ceilings = self.sessions.settings.sessions
        try:
            request = SessionCreate(
                language=template.language,
                policy=PolicyRequest(name=template.policy),
                env=body.envVars,
                idle_timeout_s=ceilings.max_idle_timeout_s,
                max_lifetime_s=body.timeout or self.settings.default_timeout_s,
                labels=body.metadata,
            )
        except ValidationError as exc:
            names = {"env": "envVars", "labels": "metadata", "max_lifetime_s": "timeout"}
            raise InvalidRequest("the sandbox's fields are invalid", problems(exc, names)) from exc
        if request.max_lifetime_s > ceilings.max_lifetime_s:
            raise InvalidRequest(
                "the sandbox would outlive the operator's ceiling",
                (FieldProblem("timeout", f"at most {ceilings.max_lifetime_s} s"),),
            )
        record = self.sessions.open(tenant, request, traceparent)
        token = secrets.token_urlsafe(32)
        entry = SandboxEntry(tenant=tenant, template=body.templateID, tokens=[_digest(token)])
        try:
            self._save(record.id, entry)
        except BaseException:
            self.sessions.delete(tenant, record.id)
            raise
        return self._answer(record, entry, token)

    def connect(self, tenant: str, sandbox: str, body: ConnectSandbox) -> Sandbox:
        """Another client (or the same, later) reaches a running sandbox: a token of its own."""
        record, entry = self._owned(tenant, sandbox)
        if record.status is SessionStatus.ENDED:
            raise SandboxNotFound(sandbox[:64])
        if body.timeout is not None:
            record = self.sessions.end_in(tenant, record.id, body.timeout)
        token = secrets.token_urlsafe(32)
        # The creator's token is kept whatever others connect (issue 44: the 17th connect evicted it);
        # the connects' tokens rotate, the newest MAX_TOKENS - 1 kept.
        creator, connected = entry.tokens[:1], entry.tokens[1:]
        entry.tokens = [*creator, *[*connected, _digest(token)][-(MAX_TOKENS - len(creator)) :]]
        self._save(record.id, entry)
        return self._answer(record, entry, token)

    def running(self, tenant: str, metadata: dict[str, str]) -> list[SandboxDetail]:
        records = [r for r in self.sessions.list(tenant, None) if r.status is not SessionStatus.ENDED]
        entries = self._entries([r.id for r in records])
        return [self._detail(r, e) for r, e in zip(records, entries, strict=True)
                if e is not None and e.tenant == tenant and metadata.items() <= r.labels.items()]  # fmt: skip

    def detail(self, tenant: str, sandbox: str) -> SandboxDetail:
        record, entry = self._owned(tenant, sandbox)
        if record.status is SessionStatus.ENDED:
            raise SandboxNotFound(sandbox[:64])
        return self._detail(record, entry)

    def set_timeout(self, tenant: str, sandbox: str, seconds: int) -> None:
        record, _ = self._owned(tenant, sandbox)
        if record.status is SessionStatus.ENDED:
            raise SandboxNotFound(sandbox[:64])
        self.sessions.end_in(tenant, record.id, seconds)

    def kill(self, tenant: str, sandbox: str) -> None:
        """End it now; a sandbox that already ended is not found (the SDK's kill then answers False)."""
        record, _ = self._owned(tenant, sandbox)
        if record.status is SessionStatus.ENDED:
            raise SandboxNotFound(sandbox[:64])
        self.sessions.delete(tenant, record.id)

    # the sandbox plane (the caller has only the sandbox id and a token)
    def open(self, sandbox: str | None, token: str | None) -> Opened:
        """The sandbox a token opens, running or ended; BadAccessToken when it opens none (the same
        answer for an unknown id, another sandbox's token and no token: nothing is learnt by trying)."""
        if not sandbox or not token or not SANDBOX_ID.fullmatch(sandbox):
            raise BadAccessToken()
        entry = self._entries([session_id(sandbox)])[0]
        digest = _digest(token)
        if entry is None or not any(hmac.compare_digest(digest, t) for t in entry.tokens):
            raise BadAccessToken()
        try:
            record = self.sessions.owned(entry.tenant, session_id(sandbox))
        except SessionNotFound as exc:  # the session's record expired before the entry
            raise BadAccessToken() from exc
        return Opened(record, entry)

    # storage
    def _owned(self, tenant: str, sandbox: str) -> tuple[SessionRecord, SandboxEntry]:
        """The tenant's sandbox, or SandboxNotFound (another tenant's sandbox does not exist for it)."""
        entry = self._entries([session_id(sandbox)])[0] if SANDBOX_ID.fullmatch(sandbox) else None
        if entry is None or entry.tenant != tenant:
            raise SandboxNotFound(sandbox[:64])
        try:
            return self.sessions.owned(tenant, session_id(sandbox)), entry
        except SessionNotFound as exc:
            raise SandboxNotFound(sandbox[:64]) from exc

    def _entries(self, ids: list[str]) -> list[SandboxEntry | None]:
        if not ids:
            return []
        with redis_errors():
            raws = self.redis.mget([self.keys.sandbox(i) for i in ids])
        return [None if raw is None else SandboxEntry.model_validate(json.loads(raw)) for raw in raws]

    def _save(self, sid: str, entry: SandboxEntry) -> None:
        with redis_errors():
            self.redis.set(self.keys.sandbox(sid), entry.model_dump_json(), ex=self._ttl_s)

    def _answer(self, record: SessionRecord, entry: SandboxEntry, token: str) -> Sandbox:
        return Sandbox(templateID=entry.template, sandboxID=sandbox_id(record.id), clientID=record.tenant,
                       envdAccessToken=token, trafficAccessToken=token)  # fmt: skip

    @staticmethod
    def _detail(record: SessionRecord, entry: SandboxEntry) -> SandboxDetail:
        return SandboxDetail(
            templateID=entry.template,
            sandboxID=sandbox_id(record.id),
            clientID=record.tenant,
            startedAt=_iso(record.created_at),
            endAt=_iso(record.ended_at or record.created_at + record.max_lifetime_s),
            cpuCount=max(1, math.ceil(record.policy.cpu)),
            memoryMB=record.policy.memory_mb,
            diskSizeMB=record.policy.disk_mb,
            metadata=record.labels,
        )


__all__ = ["SandboxEntry", "Opened", "Sandboxes", "metadata_filter", "sandbox_id", "session_id"]
