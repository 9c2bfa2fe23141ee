"""Egress rules (pure logic): host patterns, which operator patterns cover a request's, which
upstream addresses an allowlisted name may lead to, and the per-execution rule the proxy enforces.

A pattern is `host`, `*.domain` (any name under domain, not domain itself) or either with `:port`.
Without a port it allows 80 and 443 (HTTP and HTTPS); with one, only that port.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_PATTERN = re.compile(rf"^(\*\.)?({_LABEL}(?:\.{_LABEL})*)(?::(\d{{1,5}}))?$")
DEFAULT_PORTS = frozenset({80, 443})

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class HostPattern:
    wildcard: bool
    host: str
    port: int | None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        found = _PATTERN.match(text.strip().lower())
        port = int(found.group(3)) if found and found.group(3) else None
        if found is None or len(found.group(2)) > 253 or (port is not None and not 0 < port < 65536):
            raise ValueError(
                f"{text!r} is not a host pattern: use a name (api.example.com), *.domain, "
                "optionally with :port (files.example.org:8443)"
            )
        return cls(bool(found.group(1)), found.group(2), port)

    @property
    def ports(self) -> frozenset[int]:
        return frozenset({self.port}) if self.port is not None else DEFAULT_PORTS

    def matches(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".")
        named = host.endswith("." + self.host) if self.wildcard else host == self.host
        return named and port in self.ports

    def covers(self, other: HostPattern) -> bool:
        """Every host:port `other` allows is allowed by self (operator pattern over a request's)."""
        if self.wildcard:
            named = other.host.endswith("." + self.host) or (other.wildcard and other.host == self.host)
        else:
            named = not other.wildcard and other.host == self.host
        return named and other.ports <= self.ports

    def __str__(self) -> str:
        return ("*." if self.wildcard else "") + self.host + (f":{self.port}" if self.port is not None else "")


def uncovered(requested: list[str], operator: list[str]) -> list[int]:
    """Indexes of requested patterns no operator pattern covers."""
    allowed = [HostPattern.parse(p) for p in operator]
    return [i for i, text in enumerate(requested) if not any(a.covers(HostPattern.parse(text)) for a in allowed)]


def address_allowed(address: str, private_ok: list[IpNetwork], never: list[IpNetwork]) -> bool:
    """May the proxy connect to this resolved address? Public ones yes; loopback, private,
    link-local (the metadata address), multicast and reserved ones only inside `private_ok`;
    the sandboxes' own networks (`never`) not at all."""
    ip = ipaddress.ip_address(address)
    if any(ip in net for net in never):
        return False
    return ip.is_global or any(ip in net for net in private_ok)


@dataclass(frozen=True)
class EgressRule:
    """What one execution may reach; stored in Redis under the proxy's address on its network."""

    execution_id: str
    tenant: str
    trace_id: str
    allow: tuple[str, ...]
    max_connections: int
    max_bytes: int
    connect_timeout_s: float
    idle_timeout_s: float

    def allows(self, host: str, port: int) -> bool:
        return any(HostPattern.parse(p).matches(host, port) for p in self.allow)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> EgressRule:
        data = json.loads(text)
        data["allow"] = tuple(data["allow"])
        return cls(**data)
