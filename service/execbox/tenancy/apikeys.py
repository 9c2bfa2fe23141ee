"""API keys: issued per tenant, stored only as SHA-256 hashes in Redis, revocable.

A key looks like `ebx_<key id>_<secret>`; the key id (8 characters) names it in listings and
revocations, the whole key is never stored. Auth is on unless EXECBOX_AUTH__ENABLED=false (for
local development only; every request is then tenant `default`).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Annotated

import redis
from pydantic import AfterValidator

from execbox.core.keys import TENANT_SPACE
from execbox.core.redis import redis_errors, text
from execbox.tenancy.errors import InvalidKey
from execbox.tenancy.keys import TenancyKeys

TENANT_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
DEFAULT_TENANT = "default"
KEY_WORDS = frozenset(
    {"active", "answers", "apikey", "apikeys", "approval", "approvals", "asks", "bytes", "cancel", "cells", "contexts",
     "console", "dead", "deadlines", "denied", "done", "drained", "due", "e2b", "egress", "events", "exe", "file",
     "finished", "firings", "idem", "kept", "lease", "live", "members", "nodes", "open", "pending", "poison", "q",
     "rate", "replay", "ring", "rule", "run", "runlock", "running", "runrate", "runs", "schedule", "schedules",
     "script", "scripts", "scriptuse", "secret", "ses", "slot", "starts", "surprise", "surprises",
     "taken", "tenant", "uid", "watchers", "worker"}
)  # fmt: skip
"""Every fixed word of the key schema. The rooms own their keys and sit above tenancy, so the list is
written here; tests/unit/test_key_schema.py fails, naming the word, when a room's new key adds one."""
RESERVED_TENANTS = KEY_WORDS | {
    TENANT_SPACE, "admin", "operator", "shared", "system", "execbox", "all", "everyone", "none", "null"
}  # fmt: skip
"""Names no new tenant may take: every fixed word of the key schema (`active`, `due`, `live`, ...) and
the service's own words. Keys are safe without this (a tenant's keys live under `t:`, see
execbox.core.keys); refusing them keeps logs, metrics and the operator's reading unambiguous too."""


def tenant_name_problem(tenant: str) -> str | None:
    """Why `tenant` cannot name a new tenant, or None when it can."""
    if not TENANT_PATTERN.match(tenant):
        return f"tenant {tenant!r} must match {TENANT_PATTERN.pattern}"
    if tenant in RESERVED_TENANTS:
        return f"tenant name {tenant!r} is reserved for the service's own keys; choose another name"
    return None


def valid_tenant(tenant: str) -> str:
    """`tenant` when it may name a new tenant; ValueError (a 422 in a request body) naming why not."""
    problem = tenant_name_problem(tenant)
    if problem is not None:
        raise ValueError(problem)
    return tenant


TenantName = Annotated[str, AfterValidator(valid_tenant)]
"""A request field naming a new tenant."""


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant: str
    created_at: float
    revoked: bool = False
    require_approval: bool = False
    """The operator's policy: every execution or run step with side effects this key submits waits for
    an approval, whether or not it asks for one, and the key may decide no approval (maker-checker).
    Keys stored before the attribute existed read as False."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._keys = TenancyKeys(prefix)

    def _key(self, digest: str) -> str:
        return self._keys.api_key(digest)

    def _index(self) -> str:
        return self._keys.api_keys

    def create(self, tenant: str, require_approval: bool = False) -> tuple[str, KeyInfo]:
        """A new key for tenant: (the key, shown once; its info). With `require_approval`, the key's
        writes wait for a decision by another key (KeyInfo.require_approval)."""
        valid_tenant(tenant)
        key_id = secrets.token_hex(4)
        key = f"ebx_{key_id}_{secrets.token_urlsafe(32)}"
        info = KeyInfo(key_id, tenant, time.time(), require_approval=require_approval)
        stored = {k: v for k, v in info.__dict__.items() if k != "require_approval" or v}  # as before, when unset
        with redis_errors(), self._redis.pipeline() as pipe:
            pipe.set(self._key(_digest(key)), json.dumps(stored))
            pipe.hset(self._index(), key_id, _digest(key))
            pipe.execute()
        return key, info

    def revoke(self, key_id: str) -> bool:
        with redis_errors():
            digest = self._redis.hget(self._index(), key_id)
            if digest is None:
                return False
            text = digest.decode() if isinstance(digest, bytes) else str(digest)
            raw = self._redis.get(self._key(text))
            if raw is None:
                return False
            info = json.loads(raw) | {"revoked": True}
            self._redis.set(self._key(text), json.dumps(info))
        return True

    def list(self) -> list[KeyInfo]:
        with redis_errors():
            digests = list(self._redis.hvals(self._index()))
            raws = self._redis.mget([self._key(d.decode() if isinstance(d, bytes) else str(d)) for d in digests])
        return sorted((_info(json.loads(r)) for r in raws if r), key=lambda k: k.created_at)

    def info(self, key_id: str) -> KeyInfo | None:
        """The key named `key_id` (revoked or not), or None when there is none."""
        with redis_errors():
            digest = self._redis.hget(self._index(), key_id)
            raw = None if digest is None else self._redis.get(self._key(text(digest)))
        return None if raw is None else _info(json.loads(raw))

    def requires_approval(self, key_id: str) -> bool:
        """Whether the key's writes need another key's approval (an unknown key: no, it cannot call)."""
        info = self.info(key_id)
        return info is not None and info.require_approval

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant an `Authorization: Bearer` header belongs to; InvalidKey otherwise."""
        redis_key = self.lookup_key(authorization)
        with redis_errors():
            raw = self._redis.get(redis_key)
        return self.tenant_from(raw)

    def digest_key(self, digest: str) -> str:
        """Where the key whose SHA-256 is `digest` is stored."""
        return self._key(digest)

    def lookup_key(self, authorization: str | None) -> str:
        """Where the key of an `Authorization: Bearer` header is stored (for an async lookup)."""
        key = bearer_token(authorization)
        if key is None:
            raise InvalidKey("no API key")
        return self._key(_digest(key))

    @staticmethod
    def tenant_from(raw: bytes | str | None) -> str:
        return ApiKeys.key_from(raw).tenant

    @staticmethod
    def key_from(raw: bytes | str | None) -> KeyInfo:
        """The stored key's info; InvalidKey when it is unknown or revoked."""
        if raw is None:
            raise InvalidKey("unknown API key")
        info = json.loads(raw)
        if info.get("revoked"):
            raise InvalidKey("this API key was revoked")
        return _info(info)


def _info(stored: dict[str, object]) -> KeyInfo:
    """A stored key's info; one stored before an attribute existed reads with its default."""
    created = stored.get("created_at", 0)
    return KeyInfo(
        str(stored["key_id"]), str(stored["tenant"]), float(created) if isinstance(created, int | float) else 0.0,
        revoked=bool(stored.get("revoked", False)), require_approval=bool(stored.get("require_approval", False)),
    )  # fmt: skip
