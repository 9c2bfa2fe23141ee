"""A session's status and why it ended: stable enums of the contract (docs/api.md): never rename or reuse a value."""

from __future__ import annotations

import enum


class SessionStatus(enum.StrEnum):
    """A session: starting → ready → ended. Values never change."""

    STARTING = "starting"
    READY = "ready"
    ENDED = "ended"


class SessionEnd(enum.StrEnum):
    """Why a session ended. A fixed, documented enum: never rename or reuse a value."""

    DELETED = "deleted"
    IDLE_TIMEOUT = "idle_timeout"
    MAX_LIFETIME = "max_lifetime"
    WORKER_LOST = "worker_lost"
    SANDBOX_ERROR = "sandbox_error"
