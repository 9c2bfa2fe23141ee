"""Per-tenant quotas (policies/tenants.yaml): named policies allowed, executions per minute,
executions queued or running at once; and the queue's own depth limit (API side).

Past a limit the API answers 429 (tenant limits) or 503 (queue full) with Retry-After and
RateLimit-* headers; nothing is queued. Counting lives in Redis, so every API replica agrees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from execbox.errors import CapacityError, FieldProblem, RequestError
from execbox.policies import PolicyConfigError
from execbox.store import ExecutionStore


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid")

    running: int = Field(ge=1)
    per_minute: int = Field(ge=1)
    policies: list[str] = Field(min_length=1)


class _QuotaFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: _Quota
    tenants: dict[str, _Quota] = {}


class PolicyNotAllowed(RequestError):
    code = "request.policy_not_allowed"
    http_status = 403

    def __init__(self, tenant: str, name: str, allowed: list[str]) -> None:
        super().__init__(
            f"tenant {tenant!r} may not use policy {name!r}; allowed: {', '.join(allowed)}",
            (FieldProblem("policy.name", f"one of {', '.join(allowed)}"),),
        )


class RateLimited(CapacityError):
    code = "rate_limited"
    http_status = 429


class QueueFull(CapacityError):
    code = "queue_full"
    http_status = 503


@dataclass(frozen=True)
class Admission:
    """RateLimit-* headers for an accepted request."""

    headers: dict[str, str]


class Quotas:
    def __init__(self, quotas: _QuotaFile, store: ExecutionStore, max_queue_depth: int) -> None:
        self._quotas = quotas
        self._store = store
        self._max_queue_depth = max_queue_depth

    @classmethod
    def load(cls, path: Path, store: ExecutionStore, max_queue_depth: int) -> Quotas:
        try:
            quotas = _QuotaFile.model_validate(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise PolicyConfigError(f"{path}: {exc}") from exc
        return cls(quotas, store, max_queue_depth)

    def quota(self, tenant: str) -> _Quota:
        return self._quotas.tenants.get(tenant, self._quotas.default)

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
        verdict, count = self._store.admit(tenant, execution_id, int(now // 60), quota.per_minute, quota.running)
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
