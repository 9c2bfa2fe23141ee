"""The executions room's settings sections, the queue (`EXECBOX_QUEUE__*`) and the workers' leases and reaper
(`EXECBOX_WORKER__*`), and `ExecutionsConfig`: what the room reads of the deployment's settings.

The room never names the root (`execbox.settings.Settings`, above the rooms); its functions take
`ExecutionsConfig`, which the root satisfies. The sections of rooms it may not import (the sandbox's,
since the API imports this room; webhooks' and the API's, above it) appear as the few attributes it reads.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from execbox.core.settings import HasRedis
from execbox.egress.settings import EgressSettings
from execbox.fleet.nodes import NODE_PATTERN


class QueueSettings(BaseModel):
    name: str = Field("execbox", description="RQ queue the API enqueues to and workers listen on.")
    setup_margin_s: int = Field(60, ge=5, description="RQ job timeout = run timeout + this margin (last resort only).")
    max_depth: int = Field(10000, ge=1, description="Executions the queue may hold; above it POST answers 503.")


class WorkerSettings(BaseModel):
    lease_s: float = Field(
        10.0,
        gt=0,
        description="A running execution whose worker stopped renewing its lease "
        "for this long is declared lost (sandbox.error, retryable).",
    )
    reaper_interval_s: float = Field(
        15.0,
        gt=0,
        description="How often each worker sweeps for lost executions, expired queue entries and orphaned containers.",
    )
    orphan_grace_s: float = Field(
        30.0,
        ge=0,
        description="An execbox container that no live worker holds a lease for is removed by the "
        "reaper once it is older than this.",
    )
    node: str | None = Field(
        None,
        pattern=NODE_PATTERN,
        description="The node (host) this worker runs on, as executions, heartbeats and drains name it "
        "(`execbox nodes`); unset: the host name. In a Swarm stack: `{{.Node.Hostname}}`.",
    )


class _Docker(Protocol):
    """Of the sandbox's section (execbox.sandbox.settings.DockerSettings): the runtimes a run is given."""

    @property
    def runtime(self) -> str | None: ...
    @property
    def runsc_network_runtime(self) -> str: ...


class _Webhooks(Protocol):
    """Of webhooks' section (execbox.webhooks.settings.WebhookSettings): the hosts a callback may name."""

    @property
    def allow_hosts(self) -> list[str]: ...


class _Api(Protocol):
    """Of the API's section (execbox.settings.ApiSettings): how long a live stream stays quiet."""

    @property
    def sse_keepalive_s(self) -> float: ...


class ExecutionsConfig(HasRedis, Protocol):
    """What the executions room reads of the deployment's settings."""

    @property
    def queue(self) -> QueueSettings: ...
    @property
    def worker(self) -> WorkerSettings: ...
    @property
    def egress(self) -> EgressSettings: ...
    @property
    def docker(self) -> _Docker: ...
    @property
    def webhooks(self) -> _Webhooks: ...
    @property
    def api(self) -> _Api: ...
    @property
    def retention_s(self) -> int: ...


__all__ = ["ExecutionsConfig", "QueueSettings", "WorkerSettings"]
