"""The egress room's settings section (`EXECBOX_EGRESS__*`), and what the egress proxy's process reads of the root."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, Field

from execbox.core.settings import HasRedis


class EgressSettings(BaseModel):
    port: int = Field(3128, ge=1, le=65535, description="Port the egress proxy listens on (in its container).")
    container: str = Field(
        "execbox-egress",
        description="Name or id of the egress proxy's container, which workers attach to each allowlisted "
        "execution's network.",
    )
    subnet_pool: str = Field(
        "10.213.0.0/16", description="Address range the per-execution networks (/28 each) are carved from."
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=120, description="Timeout of the proxy's upstream connects.")
    idle_timeout_s: float = Field(60.0, gt=0, description="A proxied connection idle this long is closed.")
    max_connections: int = Field(64, ge=1, description="Connections one execution may open through the proxy.")
    max_bytes: int = Field(104857600, ge=1024, description="Bytes (both directions) one execution may move.")
    slot_cooldown_s: float = Field(
        30.0,
        ge=0,
        description="A per-execution network slot (/28) stays unused this long after its run's network is "
        "removed, so nothing keyed by the proxy's address on it can ever be served to the next run.",
    )
    public_key: str | None = Field(
        None,
        description="The egress proxy's public key (base64), with which `execbox secrets set` seals secret "
        "headers; `make up` generates the pair.",
    )
    private_key_file: Path | None = Field(
        None,
        description="The egress proxy's private key file (only the proxy's container has it); unset: the proxy "
        "adds no secret headers and refuses requests that need one.",
    )
    allow_private_cidrs: list[str] = Field(
        default_factory=list,
        description="Private, loopback or link-local ranges upstreams may resolve to (default: none, so an "
        "allowlisted name can never lead to an internal service or the metadata address).",
    )


class EgressConfig(HasRedis, Protocol):
    """What `run_egress` reads of the deployment's settings (execbox.settings.Settings has it all)."""

    @property
    def egress(self) -> EgressSettings: ...
    @property
    def retention_s(self) -> int: ...
    @property
    def log_level(self) -> str: ...


__all__ = ["EgressConfig", "EgressSettings"]
