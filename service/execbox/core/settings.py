"""The settings mechanism, and the sections that are core mechanisms (Redis, telemetry).

`SettingsRoot` is the behaviour every deployment's settings share: EXECBOX_<NAME> and
EXECBOX_<GROUP>__<NAME> names, unknown fields refused. Each room declares its own section in
`<room>/settings.py`; `execbox.settings.Settings`, a layer above the rooms, assembles them, and each
entry point builds it once. A room never names that root: it takes its section, or a Protocol of its
own naming what it reads (`HasRedis` is the core's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from execbox.core.redis_roles import role_url

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The repository, found from this module's place: the default policies/ and sandbox-images/ folders."""


class RedisSettings(BaseModel):
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis DSN shared by API and workers: redis://[role:pw@]host:port/db, or "
        "sentinel://[role:pw@]host1:port,host2:port,host3:port/<master>?db=0 to follow the primary Sentinel names.",
    )
    socket_timeout_s: float = Field(5.0, gt=0, description="Timeout of every Redis command but blocking waits.")
    key_prefix: str = Field("execbox", description="Prefix of every key execbox writes.")
    accept_replicas: int = Field(
        0,
        ge=0,
        description="Replicas that must hold an accepted execution before its 202 (WAIT); fewer in time: 503, "
        "retryable. 0: no wait (one Redis without a replica).",
    )
    accept_wait_ms: int = Field(
        500, gt=0, description="How long an acceptance waits for those replicas (with accept_replicas above 0)."
    )
    password_file: Path | None = Field(
        None,
        description="File holding this component's Redis password (a Swarm or Kubernetes secret). It takes the "
        "place of any password in url, whose user name stays; url then carries no secret.",
    )

    @model_validator(mode="after")
    def _password_from_file(self) -> RedisSettings:
        if self.password_file is None:
            return self
        try:
            password = self.password_file.read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"redis.password_file {str(self.password_file)!r} cannot be read: {exc.strerror}"
            ) from None
        if not password:
            raise ValueError(f"redis.password_file {str(self.password_file)!r} is empty")
        user = urlsplit(self.url).username or "default"
        self.url = role_url(self.url, unquote(user), password)
        self.password_file = None  # read once: a copy of these settings must not read it again
        return self


class TelemetrySettings(BaseModel):
    worker_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of this worker process's /metrics (unset: not served)."
    )
    worker_metrics_host: str = Field("127.0.0.1", description="Address the worker's /metrics listens on.")
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces). Unset: no spans are "
        "exported and nothing leaves the host.",
    )


class SettingsRoot(BaseSettings):
    """Every setting can be given as EXECBOX_<NAME> or EXECBOX_<GROUP>__<NAME>."""

    model_config = SettingsConfigDict(env_prefix="EXECBOX_", env_nested_delimiter="__", extra="forbid")


class HasRedis(Protocol):
    """Settings that carry the Redis section: what `execbox.core.redis.connect` reads."""

    @property
    def redis(self) -> RedisSettings: ...


__all__ = ["REPO_ROOT", "HasRedis", "RedisSettings", "SettingsRoot", "TelemetrySettings"]
