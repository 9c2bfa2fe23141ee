"""Redis through Sentinel: the `sentinel://` setting and the clients that follow the primary.

A deployment that must survive the loss of its Redis primary names its Sentinels instead of one
server: `sentinel://[user:pass@]host1:26379,host2:26379,host3:26379/mymaster?db=0`. The
credentials are the component's role (core.redis_roles; `role_url` puts them in this DSN as in a
redis:// one) and serve twice: scripts/redis-ha gives each role, on every Sentinel, the same
password and only the commands that ask where the primary is, so a client needs one secret.

The clients ask a Sentinel for the primary at each new connection; after a fail-over the next
command fails on its dead connection, redis-py retries it on a fresh one, and that one reaches the
promoted replica. Nothing here decides durability: see docs/decisions.md ("Redis that survives its
primary") for `WAIT 1` on an acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio
from redis.asyncio.connection import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncManagedConnection
from redis.sentinel import Sentinel, SentinelManagedConnection

SCHEME = "sentinel"
DEFAULT_PORT = 26379


@dataclass(frozen=True)
class SentinelTarget:
    """Where a deployment's Sentinels are, which primary they watch, and as whom to connect."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # settings and errors get logged


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() == SCHEME


def parse(url: str) -> SentinelTarget:
    """A `sentinel://` DSN as a SentinelTarget. Each refusal names the part at fault and never
    repeats the DSN, which may carry a password."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SCHEME:
        raise ValueError(f"a Sentinel setting starts with {SCHEME}://, not {scheme + sep or 'no scheme'!r}")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ValueError("a Sentinel setting has no #fragment")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username, password = _credentials(userinfo) if at else (None, None)
    master = unquote(path.strip("/"))
    if not master:
        raise ValueError("the Sentinel setting names no master: add /<master name> after the Sentinel addresses")
    if "/" in master or any(c.isspace() for c in master):
        raise ValueError(f"the master name {master!r} holds a slash or a space")
    return SentinelTarget(_addresses(hosts), master, _db(query), username, password)


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    if not colon:  # `pass@` alone, as redis:// allows, is a password for the default user
        return None, unquote(user) or None
    return unquote(user) or None, unquote(password) or None


def _addresses(hosts: str) -> tuple[tuple[str, int], ...]:
    entries = [entry.strip() for entry in hosts.split(",")]
    if not any(entries):
        raise ValueError("the Sentinel setting lists no Sentinel address (host:port, comma-separated)")
    addresses = []
    for position, entry in enumerate(entries, 1):
        if not entry:
            raise ValueError(f"Sentinel address {position} is empty (a stray comma?)")
        addresses.append(_address(entry, position))
    if len(set(addresses)) != len(addresses):
        raise ValueError("the Sentinel setting lists one Sentinel address twice")
    return tuple(addresses)


def _address(entry: str, position: int) -> tuple[str, int]:
    if entry.startswith("["):  # an IPv6 literal: [::1]:26379
        host, bracket, port = entry[1:].partition("]")
        if not bracket or not host:
            raise ValueError(f"Sentinel address {position}: an IPv6 host needs its closing ']'")
        if port and not port.startswith(":"):
            raise ValueError(f"Sentinel address {position}: expected ':<port>' after ']'")
        port = port[1:]
    else:
        host, _, port = entry.partition(":")
        if not host:
            raise ValueError(f"Sentinel address {position} has no host")
        if ":" in port:
            raise ValueError(f"Sentinel address {position}: write an IPv6 host in brackets, [host]:port")
    if not port:
        return host, DEFAULT_PORT
    if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Sentinel address {position}: port {port!r} is not a number from 1 to 65535")
    return host, int(port)


def _db(query: str) -> int:
    db = 0
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "db":
            raise ValueError(f"unknown option {name!r} in the Sentinel setting (only db is known)")
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"the Sentinel setting's db {value!r} is not a non-negative number")
        db = int(value)
    return db


def _kwargs(target: SentinelTarget, socket_timeout_s: float) -> dict[str, Any]:
    return {
        "username": target.username,
        "password": target.password,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
    }


class FollowingConnection(SentinelManagedConnection):
    """A connection to the primary that asks the Sentinels where it is at every reconnection.

    redis-py (8.1) asks only when the pool hands a connection out; one found closed in the middle
    of a command is reconnected by its retry straight to its last address, so after a fail-over
    every retry went to the dead primary until they ran out (the first requests after a promotion
    failed, 5-6 s late, in tests/integration/test_sentinel_service.py).
    """

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

    def connect_to(self, address: tuple[str, int]) -> None:
        self.host, self.port = address  # just asked for: not again
        super().connect_check_health(check_health=self.connection_pool.check_connection, retry_socket_connect=False)


class AsyncFollowingConnection(AsyncManagedConnection):
    """FollowingConnection for asyncio clients (the same gap in redis.asyncio)."""

    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)

    async def connect_to(self, address: tuple[str, int]) -> None:
        self.host, self.port = address
        await super().connect_check_health(
            check_health=self.connection_pool.check_connection, retry_socket_connect=False
        )


def sync_client(target: SentinelTarget, *, socket_timeout_s: float, health_check_interval_s: int = 30) -> redis.Redis:
    """A client of the current primary, for the API's threads, the workers and RQ."""
    common = _kwargs(target, socket_timeout_s)
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=common, **common)
    client = sentinel.master_for(
        target.master, db=target.db, health_check_interval=health_check_interval_s, connection_class=FollowingConnection
    )
    return cast(redis.Redis, client)


class BlockingSentinelPool(AsyncSentinelPool, AsyncBlockingPool):
    """A Sentinel-backed asyncio pool that, once full, makes a caller wait for a free connection (up
    to its `timeout`) as a BlockingConnectionPool does, instead of refusing at once."""


async def close_sentinels(pool: object) -> None:
    """Close the connections an asyncio Sentinel-backed pool keeps to the Sentinels themselves,
    which closing its client or the pool leaves open; nothing for any other pool."""
    manager = getattr(pool, "sentinel_manager", None)
    for client in manager.sentinels if manager is not None else ():
        await client.aclose()


def async_client(
    target: SentinelTarget, *, socket_timeout_s: float, health_check_interval_s: int = 30, **pool: object
) -> redis.asyncio.Redis:
    """The same for asyncio code (the API's event loop). `pool` goes to a BlockingSentinelPool
    (max_connections, timeout, retry, retry_on_error; a socket_timeout of its own for blocking
    reads): the Sentinels themselves are always asked with socket_timeout_s."""
    common = _kwargs(target, socket_timeout_s)
    sentinel = AsyncSentinel(list(target.sentinels), sentinel_kwargs=common, **common)
    options: dict[str, Any] = {"connection_pool_class": BlockingSentinelPool, **pool} if pool else {}
    options["connection_class"] = AsyncFollowingConnection
    client = sentinel.master_for(target.master, db=target.db, health_check_interval=health_check_interval_s, **options)
    return cast(redis.asyncio.Redis, client)


__all__ = [
    "DEFAULT_PORT",
    "SCHEME",
    "BlockingSentinelPool",
    "SentinelTarget",
    "async_client",
    "close_sentinels",
    "is_sentinel_url",
    "parse",
    "sync_client",
]
