"""Console sign-ins: an API key (or the admin token) exchanged once for a cookie's random token.

The browser holds only the token; Redis holds, under the token's SHA-256, who signed in (tenant,
key id, or the operator), the form token that every form of the console must echo (CSRF), and
what proves the credential used: for a key, the SHA-256 Redis already names the key by; for the
admin token, an HMAC of the cookie's token under it (Redis never holds anything from which the
admin token could be guessed offline: the cookie's token is not stored). Each read checks that
credential again: a key revoked since, or an admin token changed since, ends the sign-in at its
next request. A sign-in lasts
`SIGNIN_TTL_S` from its start, whatever is done with it (no sliding renewal).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass

import redis

from execbox.core.redis import redis_errors
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.errors import InvalidKey
from execbox.tenancy.keys import TenancyKeys

SIGNIN_TTL_S = 8 * 3600
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

    def start(self, credential: str, admin_token: str | None) -> tuple[str, SignIn]:
        """(the cookie's token, the sign-in) for an API key or the admin token; InvalidKey otherwise."""
        if admin_token and secrets.compare_digest(credential.encode(), admin_token.encode()):
            tenant, key_id = "", OPERATOR
        else:
            info = self._api_keys.key_from(self._stored_key(credential))
            tenant, key_id = info.tenant, info.key_id
        token = secrets.token_urlsafe(32)
        proof = _operator_proof(credential, token) if key_id == OPERATOR else _digest(credential)
        signin = SignIn(tenant, key_id, secrets.token_urlsafe(32), proof, time.time())
        with redis_errors():
            self._redis.set(self._keys.console_signin(_digest(token)), json.dumps(asdict(signin)), ex=SIGNIN_TTL_S)
        return token, signin

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


__all__ = ["OPERATOR", "SIGNIN_TTL_S", "SignIn", "SignIns"]
