"""W3C trace context: accept a `traceparent`, or start a new trace."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        return TraceContext(self.trace_id, secrets.token_hex(8), self.flags)


def from_traceparent(header: str | None) -> TraceContext:
    """Continue the caller's trace; an absent or malformed header (per W3C) starts a new one."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if match and set(match.group(1)) != {"0"} and set(match.group(2)) != {"0"}:
        return TraceContext(match.group(1), secrets.token_hex(8), match.group(3))
    return TraceContext(secrets.token_hex(16), secrets.token_hex(8))
