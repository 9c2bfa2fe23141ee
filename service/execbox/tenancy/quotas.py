"""Per-tenant quotas (policies/tenants.yaml): named policies allowed, executions per minute,
executions queued or running at once, runs per minute, the bytes kept in the shared Redis (the storage
budget, execbox.tenancy.budget); and the queue's own depth limit (API side).

Past a limit the API answers 429 (tenant limits) or 503 (queue full) with Retry-After and
RateLimit-* headers; nothing is queued. Counting lives in Redis, so every API replica agrees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from execbox.catalog.policies import PolicyConfigError
from execbox.core.redis import redis_errors, text
from execbox.core.yamltext import YAMLError, safe_load
from execbox.tenancy.budget import Charge, StorageBudget
from execbox.tenancy.errors import PolicyNotAllowed, QueueFull, RateLimited
from execbox.tenancy.keys import TenancyKeys

_ADMIT = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then return {'rate', count} end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return {'running', count} end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return {'ok', count + 1}
"""


DEFAULT_STORAGE_BUDGET_MB = 256
"""Room for the default `running` quota (64) of default-policy executions in flight, each reserving its worst
case (~4 MiB: both 1 MiB output caps, in the record and in its live events) until it ends and settles to its
size. The shipped Redis holds 1 GiB (noeviction): one tenant at this budget leaves three quarters to the
others; deployments with more tenants busy at once size Redis or lower the tenants' budgets in tenants.yaml
(decisions: the storage budget)."""

_RUN_RATE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then return count end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
return -1
"""


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid")

    running: int = Field(ge=1)
    per_minute: int = Field(ge=1)
    policies: list[str] = Field(min_length=1)
    sessions: int = Field(10, ge=0)
    session_share: float = Field(0.5, gt=0, le=1)
    """The part of the fleet's session slots (workers x per-worker slots) one tenant may hold at once."""
    declare_effects: bool = False
    """Executions with network access must declare `effect` (read or write): the ones that can reach the world."""
    schedules: int = Field(100, ge=0)
    schedule_min_interval_s: float = Field(60.0, ge=1, le=86400)
    storage_budget_mb: int = Field(DEFAULT_STORAGE_BUDGET_MB, ge=1)
    """MiB the tenant may keep in the shared Redis (records, inputs, outputs, runs) at once (execbox.tenancy.budget)."""
    runs_per_minute: int = Field(60, ge=1)
    """Runs (POST /v1/runs) the tenant may create per calendar minute."""


class _QuotaFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: _Quota
    tenants: dict[str, _Quota] = {}


@dataclass(frozen=True)
class Admission:
    """RateLimit-* headers for an accepted request."""

    headers: dict[str, str]


class Slots:
    """The counters behind the quotas: submissions per tenant and minute (`t:rate:{tenant}:{minute}`)
    and the tenant's queued or running executions (`t:active:{tenant}`): a slot is taken here at
    admission and freed here (`free`), queued into the execution's terminal transition."""

    def __init__(self, client: redis.Redis, keys: TenancyKeys) -> None:
        self.redis = client
        self.keys = keys

    def admit(self, tenant: str, execution_id: str, minute: int, per_minute: int, running: int) -> tuple[str, int]:
        """One atomic admission: ("ok", count) counts the submission in the tenant's minute and
        takes a slot among its queued or running executions; ("rate" | "running", count) refuses
        and changes nothing (a refused request does not use up the window)."""
        keys = [self.keys.rate(tenant, minute), self.keys.active(tenant)]
        with redis_errors():
            verdict, count = self.redis.register_script(_ADMIT)(
                keys=keys, args=[per_minute, running, execution_id, time.time()]
            )
        return text(verdict), int(count)

    def use(self, tenant: str, minute: int) -> tuple[int, int]:
        """(queued or running executions, submissions in `minute`) of a tenant now."""
        with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.active(tenant))
            pipe.get(self.keys.rate(tenant, minute))
            running, submitted = pipe.execute()
        return int(running), int(submitted or 0)

    def release(self, tenant: str, execution_id: str) -> None:
        with redis_errors():
            free(self.redis, self.keys, tenant, execution_id)

    def reclaim(self, older_than_s: float, ended: Callable[[str], bool]) -> int:
        """Give back slots whose execution has `ended` (or was never created: an API died between
        admission and create); only slots older than older_than_s, so a create in flight keeps its own."""
        freed = 0
        cutoff = time.time() - older_than_s
        with redis_errors():
            for key in self.redis.scan_iter(match=self.keys.tenant_keys("active"), count=100):
                stale = [text(m) for m in self.redis.zrangebyscore(key, "-inf", cutoff)]
                for execution_id in stale:
                    if ended(execution_id):
                        freed += int(self.redis.zrem(key, execution_id))
        return freed


def free(target: redis.Redis | redis.client.Pipeline, keys: TenancyKeys, tenant: str, execution_id: str) -> None:
    """Give the execution's slot back; on a pipeline, as part of that transaction (the terminal
    transition frees it in the same commit that ends the execution)."""
    target.zrem(keys.active(tenant), execution_id)


class Quotas:
    def __init__(self, quotas: _QuotaFile, slots: Slots, max_queue_depth: int) -> None:
        self._quotas = quotas
        self.slots = slots
        self._max_queue_depth = max_queue_depth
        self.budget = StorageBudget(slots.redis, slots.keys)
        self._run_rate = slots.redis.register_script(_RUN_RATE)

    @classmethod
    def load(cls, path: Path, slots: Slots, max_queue_depth: int) -> Quotas:
        try:
            quotas = _QuotaFile.model_validate(safe_load(path.read_text()))
        except (OSError, YAMLError, ValidationError) as exc:
            raise PolicyConfigError(f"{path}: {exc}") from exc
        return cls(quotas, slots, max_queue_depth)

    def quota(self, tenant: str) -> _Quota:
        return self._quotas.tenants.get(tenant, self._quotas.default)

    def named(self) -> list[str]:
        """The tenants the quota file names (the others take its default)."""
        return sorted(self._quotas.tenants)

    def admit(self, tenant: str, policy_name: str, execution_id: str, queue_depth: int) -> Admission:
        """Check every limit and take a running slot for execution_id, atomically; raise when one is
        passed (then nothing was counted or taken)."""
        quota = self.quota(tenant)
        if policy_name not in quota.policies:
            raise PolicyNotAllowed(tenant, policy_name, quota.policies)
        if queue_depth >= self._max_queue_depth:
            raise QueueFull(f"the queue holds {queue_depth} executions, its limit; retry later",
                            headers={"Retry-After": "5"})  # fmt: skip
        now = time.time()
        reset = int(60 - now % 60) or 60
        verdict, count = self.slots.admit(tenant, execution_id, int(now // 60), quota.per_minute, quota.running)
        limits = {"RateLimit-Limit": str(quota.per_minute), "RateLimit-Reset": str(reset)}
        if verdict == "rate":
            raise RateLimited(
                f"tenant {tenant!r} submitted {quota.per_minute} executions this minute, its limit; retry in {reset} s",
                headers={**limits, "RateLimit-Remaining": "0", "Retry-After": str(reset)},
            )
        if verdict == "running":
            raise RateLimited(
                f"tenant {tenant!r} already has {quota.running} executions queued or running; wait for one to end",
                headers={"Retry-After": "1", "RateLimit-Limit": str(quota.per_minute),
                         "RateLimit-Remaining": str(max(quota.per_minute - count, 0)), "RateLimit-Reset": str(reset)},
            )  # fmt: skip
        return Admission({**limits, "RateLimit-Remaining": str(max(quota.per_minute - count, 0))})

    def keep(self, tenant: str, nbytes: int, ttl_s: float, what: str) -> Charge:
        """Count `nbytes` the tenant will keep for `ttl_s` against its storage budget; StorageBudgetFull
        (429 naming `tenant.storage_budget`) and nothing counted when it would pass it."""
        return self.budget.charge(tenant, nbytes, ttl_s, self.quota(tenant).storage_budget_mb << 20, what)

    def admit_run(self, tenant: str) -> None:
        """Count one run created in the tenant's minute; RateLimited (429) past `runs_per_minute`."""
        limit = self.quota(tenant).runs_per_minute
        now = time.time()
        with redis_errors():
            count = int(self._run_rate(keys=[self.slots.keys.run_rate(tenant, int(now // 60))], args=[limit]))
        if count >= 0:
            reset = int(60 - now % 60) or 60
            raise RateLimited(
                f"tenant {tenant!r} created {limit} runs this minute, its limit (runs_per_minute); retry in {reset} s",
                headers={"Retry-After": str(reset), "RateLimit-Limit": str(limit), "RateLimit-Remaining": "0",
                         "RateLimit-Reset": str(reset)},
            )  # fmt: skip
