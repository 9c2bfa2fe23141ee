"""A tenant's storage budget: the bytes it keeps in the Redis every tenant shares, checked at admission.

What a tenant keeps is counted in one hash per tenant, `t:kept:{tenant}`, by when it expires: field
`q` holds the bytes of what expires before `q * BUCKET_S` (an admission at `now` whose data lives
`ttl_s` adds to field `ceil((now + ttl_s) / BUCKET_S)`). The tenant's use is the sum of the fields
still ahead of now; a field whose time has passed counts data Redis has already expired, and the next
admission drops it. So expiry needs no sweep and no per-record bookkeeping: each byte is counted
until at most BUCKET_S after its data is gone (never less), and the hash itself expires with the
latest data it counts. A writer that removes or shrinks data early gives its bytes back by adding a
negative amount to the field it charged (`settle`); an amount for a field already passed is dropped.

Admission is one Lua script: read the live fields, refuse when the charge would pass the budget
(nothing counted), else add. Settling never refuses: the data is already stored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from execbox.core.redis import redis_errors
from execbox.tenancy.errors import StorageBudgetFull
from execbox.tenancy.keys import TenancyKeys

BUCKET_S = 900
"""Granularity of the expiry buckets: room comes back at most this long after the data expired."""
FOREVER_S = 100 * 365 * 86400
"""The lifetime to charge for data kept without a TTL (script versions): counted until it is removed."""

_CHARGE = """
local now_q = tonumber(ARGV[1])
local budget = tonumber(ARGV[2])
local fields = redis.call('HGETALL', KEYS[1])
local used, first, latest = 0, 0, 0
for i = 1, #fields, 2 do
  local q = tonumber(fields[i])
  if q == nil or q <= now_q then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    used = used + tonumber(fields[i + 1])
    if first == 0 or q < first then first = q end
    if q > latest then latest = q end
  end
end
local add = 0
for i = 3, #ARGV, 2 do
  if tonumber(ARGV[i]) > now_q then add = add + tonumber(ARGV[i + 1]) end
end
if budget >= 0 and add > 0 and used + add > budget then return {0, used, first} end
for i = 3, #ARGV, 2 do
  local q = tonumber(ARGV[i])
  if q > now_q then
    if redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) <= 0 then redis.call('HDEL', KEYS[1], ARGV[i]) end
    if q > latest then latest = q end
  end
end
if latest > 0 then redis.call('EXPIREAT', KEYS[1], latest * BUCKET_S) end
return {1, used + add, first}
"""


def bucket(expires_at: float) -> int:
    """The field that counts data expiring at `expires_at` (Unix time)."""
    return math.ceil(expires_at / BUCKET_S)


@dataclass(frozen=True)
class Charge:
    """What an admission counted: `bytes` in field `bucket` (give them back with the same two)."""

    bytes: int
    bucket: int


class StorageBudget:
    """The counters behind `storage_budget_mb` (tenancy.quotas): charge at admission, settle on removal."""

    def __init__(self, client: redis.Redis, keys: TenancyKeys, clock: Callable[[], float] = time.time) -> None:
        self.redis = client
        self.keys = keys
        self._clock = clock
        self._script = client.register_script(_CHARGE.replace("BUCKET_S", str(BUCKET_S)))

    def _run(self, tenant: str, budget: int, changes: Sequence[tuple[int, int]]) -> tuple[bool, int, int]:
        args: list[int] = [math.floor(self._clock() / BUCKET_S), budget]
        for field, amount in changes:
            args += [field, amount]
        with redis_errors():
            ok, used, first = self._script(keys=[self.keys.kept(tenant)], args=args)
        return bool(ok), int(used), int(first)

    def charge(self, tenant: str, nbytes: int, ttl_s: float, budget: int, what: str) -> Charge:
        """Count `nbytes` kept for `ttl_s` from now, or raise StorageBudgetFull (429, nothing counted)."""
        field = bucket(self._clock() + ttl_s)
        ok, used, first = self._run(tenant, budget, [(field, nbytes)])
        if not ok:
            raise StorageBudgetFull(tenant, used, budget, nbytes, first * BUCKET_S, what)
        return Charge(nbytes, field)

    def settle(self, tenant: str, changes: Sequence[tuple[int, int]]) -> None:
        """Apply (field, bytes) changes without a check: negative gives bytes back (data removed or smaller
        than reserved), positive counts data kept longer than charged."""
        if changes:
            self._run(tenant, -1, changes)

    def used(self, tenant: str) -> int:
        """Bytes the tenant keeps now (what has not yet expired)."""
        return self._run(tenant, -1, [])[1]


__all__ = ["BUCKET_S", "FOREVER_S", "Charge", "StorageBudget", "bucket"]
