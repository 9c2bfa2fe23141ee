"""Console sign-ins: an API key (or the admin token) exchanged once for a cookie's random token.

The browser holds only the token; Redis holds, under the token's SHA-256, who signed in (tenant,
key id, or the operator), the form token that every form of the console must echo (CSRF), and
what proves the credential used: for a key, the SHA-256 Redis already names the key by; for the
admin token, an HMAC of the cookie's token under it (Redis never holds anything from which the
admin token could be guessed offline: the cookie's token is not stored). Each read checks that
credential again: a key revoked since, or an admin token changed since, ends the sign-in at its
next request. A sign-in lasts
`SIGNIN_TTL_S` from its start, whatever is done with it (no sliding renewal).

Failed sign-ins are counted in Redis per fixed window of `FAILURE_WINDOW_S` (every API process counts
into the same counters, so adding processes adds no tries): `FAILURES_PER_SOURCE` from one address,
then that address is refused until the window ends; and `ADMIN_FAILURES` tries of something that is
not shaped like an API key (a guess at the admin token, which may be weak) from all addresses
together, then every such try is refused until the window ends. API keys carry 256 random bits, so
that global bound never refuses a tenant's key; the operator keeps the CLI meanwhile. A refused
try is not checked at all (it learns nothing) and answers 429 with Retry-After.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass

import redis

from execbox.core.redis import redis_errors
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.errors import InvalidKey, SignInThrottled
from execbox.tenancy.keys import TenancyKeys

SIGNIN_TTL_S = 8 * 3600
FAILURE_WINDOW_S = 300
FAILURES_PER_SOURCE = 10
"""Failed sign-ins one address may make in a window."""
ADMIN_FAILURES = 50
"""Failed sign-ins with something not shaped like an API key (admin-token guesses), from all addresses, in a window."""
API_KEY_PREFIX = "ebx_"
"""How every API key starts (ApiKeys.create); anything else tried at sign-in is a guess at the admin token."""
OPERATOR = "operator"
"""The key id of a sign-in with the admin token: the operator's pages, no tenant's data."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _operator_proof(admin_token: str, token: str) -> str:
    return hmac.new(admin_token.encode(), token.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SignIn:
    tenant: str
    """The key's tenant; "" for the operator."""
    key_id: str
    form_token: str
    credential: str
    """The key's SHA-256, or the operator's HMAC of the cookie's token under the admin token:
    checked again at each read."""
    started_at: float

    @property
    def operator(self) -> bool:
        return self.key_id == OPERATOR


class SignIns:
    def __init__(self, client: redis.Redis, keys: TenancyKeys, api_keys: ApiKeys) -> None:
        self._redis = client
        self._keys = keys
        self._api_keys = api_keys

    def start(self, credential: str, admin_token: str | None, source: str = "") -> tuple[str, SignIn]:
        """(the cookie's token, the sign-in) for an API key or the admin token from address `source`;
        InvalidKey otherwise, SignInThrottled (not checked) past the failures a window allows."""
        now = time.time()
        window = int(now // FAILURE_WINDOW_S)
        counters = [self._keys.console_failures(_digest(source), window)]
        if not credential.startswith(API_KEY_PREFIX):
            counters.append(self._keys.console_failures("all", window))
        with redis_errors():
            counts = [int(n or 0) for n in self._redis.mget(counters)]
        retry_after_s = max(1, math.ceil((window + 1) * FAILURE_WINDOW_S - now))
        if counts[0] >= FAILURES_PER_SOURCE:
            raise SignInThrottled(retry_after_s, "from this address")
        if len(counts) > 1 and counts[1] >= ADMIN_FAILURES:
            raise SignInThrottled(retry_after_s, "with an admin token, from all addresses")
        try:
            tenant, key_id = self._credential(credential, admin_token)
        except InvalidKey:
            with redis_errors(), self._redis.pipeline(transaction=False) as pipe:
                for counter in counters:
                    pipe.incr(counter)
                    pipe.expire(counter, 2 * FAILURE_WINDOW_S)
                pipe.execute()
            raise
        token = secrets.token_urlsafe(32)
        proof = _operator_proof(credential, token) if key_id == OPERATOR else _digest(credential)
        signin = SignIn(tenant, key_id, secrets.token_urlsafe(32), proof, time.time())
        with redis_errors():
            self._redis.set(self._keys.console_signin(_digest(token)), json.dumps(asdict(signin)), ex=SIGNIN_TTL_S)
        return token, signin

    def _credential(self, credential: str, admin_token: str | None) -> tuple[str, str]:
        """(tenant, key id) of an API key or the admin token; InvalidKey otherwise."""
        if admin_token and secrets.compare_digest(credential.encode(), admin_token.encode()):
            return "", OPERATOR
        info = self._api_keys.key_from(self._stored_key(credential))
        return info.tenant, info.key_id

    def read(self, token: str | None, admin_token: str | None) -> SignIn | None:
        """The sign-in a cookie's token stands for, while it lasts and its credential still holds."""
        if not token or len(token) > 100:
            return None
        with redis_errors():
            raw = self._redis.get(self._keys.console_signin(_digest(token)))
        if raw is None:
            return None
        try:
            signin = SignIn(**json.loads(raw))
        except (ValueError, TypeError):
            return None
        if signin.operator:
            held = admin_token is not None and secrets.compare_digest(
                _operator_proof(admin_token, token), signin.credential
            )
            return signin if held else None
        try:
            with redis_errors():
                raw_key = self._redis.get(self._api_keys.digest_key(signin.credential))
            ApiKeys.key_from(raw_key)
        except InvalidKey:
            return None
        return signin

    def end(self, token: str | None) -> None:
        if token and len(token) <= 100:
            with redis_errors():
                self._redis.delete(self._keys.console_signin(_digest(token)))

    def _stored_key(self, credential: str) -> bytes | str | None:
        with redis_errors():
            raw: bytes | str | None = self._redis.get(self._api_keys.lookup_key(f"Bearer {credential}"))
        return raw


__all__ = ["ADMIN_FAILURES", "FAILURES_PER_SOURCE", "FAILURE_WINDOW_S", "OPERATOR", "SIGNIN_TTL_S", "SignIn", "SignIns"]
