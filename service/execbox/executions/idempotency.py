"""Idempotency keys for POSTs that create something (API side, state in Redis).

A client that retries a POST with the same `Idempotency-Key` and the same body gets the resource
the first attempt created (`Idempotent-Replayed: true`), however many retries arrive and however
concurrently; the same key with a different body is refused (422 `idempotency.mismatch`). The
first attempt claims the key atomically (SET NX); concurrent retries wait for it to finish.
Keys are scoped per tenant and route and kept for `EXECBOX_API__IDEMPOTENCY_TTL_S`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import redis

from execbox.core.errors import FieldProblem, RequestError
from execbox.core.redis import redis_errors
from execbox.executions.errors import IdempotencyInProgress, IdempotencyMismatch
from execbox.executions.keys import ExecutionKeys

KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
_PENDING = "pending"
CLAIM_S = 10
"""Life of a first attempt's claim, renewed while it creates: an attempt that crashed holds the key
this long at most, then a retry creates instead."""
_RENEW = """
local entry = redis.call('GET', KEYS[1])
if entry and cjson.decode(entry)['state'] == 'pending' then return redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return 0
"""


def check_key(key: str) -> str:
    if not KEY_PATTERN.match(key):
        raise RequestError(
            "Idempotency-Key must be 1-255 printable ASCII characters without spaces",
            (FieldProblem("header.Idempotency-Key", "1-255 printable ASCII characters"),),
        )
    return key


T = TypeVar("T")


@dataclass(frozen=True)
class KeyResult:
    resource_id: str
    replayed: bool


class IdempotencyKeys:
    def __init__(self, client: redis.Redis, prefix: str, ttl_s: int, wait_s: float = 30.0) -> None:
        self._redis = client
        self._keys = ExecutionKeys(prefix)
        self._ttl_s = ttl_s
        self._wait_s = wait_s

    def _key(self, tenant: str, route: str, key: str) -> str:
        return self._keys.idempotency(tenant, route, key)

    def once(
        self,
        tenant: str,
        route: str,
        key: str | None,
        digest: Callable[[], str],
        create: Callable[[], T],
        ident: Callable[[T], str],
        existing: Callable[[str], T],
    ) -> tuple[T, bool]:
        """What a create-POST answers, and whether it is a replay: without a key, `create()`; under
        one, `create()` for the first request of (tenant, route, key) and `existing(id)` of what it
        created for every retry (`digest()`, the request's digest, tells a retry from a different
        request under the same key). Every route that honours Idempotency-Key goes through here."""
        if key is None:
            return create(), False
        made: list[T] = []

        def first() -> str:
            made.append(create())
            return ident(made[0])

        outcome = self.run(tenant, route, key, digest(), first)
        if made:
            return made[0], False
        return existing(outcome.resource_id), True

    def run(self, tenant: str, route: str, key: str, request_hash: str, create: Callable[[], str]) -> KeyResult:
        """Create once per (tenant, route, key): `create` runs for the first request only."""
        redis_key = self._key(tenant, route, check_key(key))
        pending = json.dumps({"state": _PENDING, "hash": request_hash})
        deadline = time.monotonic() + self._wait_s
        while True:
            with redis_errors():
                claimed = self._redis.set(redis_key, pending, nx=True, ex=CLAIM_S)
            if claimed:
                return KeyResult(self._create(redis_key, request_hash, create), replayed=False)
            resource_id = self._await(redis_key, key, request_hash, deadline)
            if resource_id is not None:
                return KeyResult(resource_id, replayed=True)
            # The first attempt failed and released the key: this request may try to create.

    def _create(self, redis_key: str, request_hash: str, create: Callable[[], str]) -> str:
        done_creating = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(redis_key, done_creating), daemon=True)
        renewer.start()
        try:
            resource_id = create()
        except BaseException:
            with redis_errors():
                self._redis.delete(redis_key)  # let a retry try again
            raise
        finally:
            done_creating.set()
        done = json.dumps({"state": "done", "hash": request_hash, "id": resource_id})
        with redis_errors(), self._redis.pipeline() as pipe:
            pipe.set(redis_key, done, ex=self._ttl_s)
            pipe.publish(redis_key, resource_id)
            pipe.execute()
        return resource_id

    def _renew(self, redis_key: str, done: threading.Event) -> None:
        """Keep the claim alive while this attempt creates (a create slower than CLAIM_S, e.g. large
        inline files, must not let a retry create a second resource)."""
        renew = self._redis.register_script(_RENEW)
        while not done.wait(CLAIM_S / 3):
            try:
                renew(keys=[redis_key], args=[CLAIM_S])
            except redis.RedisError:
                pass  # the create itself will fail on the same Redis

    def _await(self, redis_key: str, key: str, request_hash: str, deadline: float) -> str | None:
        """The resource id once the first attempt finishes; None if it gave the key up."""
        with redis_errors():
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(redis_key)
                while True:
                    raw = self._redis.get(redis_key)
                    if raw is None:
                        return None
                    entry = json.loads(raw)
                    if entry["hash"] != request_hash:
                        raise IdempotencyMismatch(key)
                    if entry["state"] != _PENDING:
                        return str(entry["id"])
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise IdempotencyInProgress(key)
                    pubsub.get_message(timeout=min(remaining, 1.0))
            finally:
                pubsub.close()
