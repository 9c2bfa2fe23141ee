"""The egress proxy: the only way out for a sandbox with a network allowlist.

Each allowlisted execution runs on a Docker network of its own with no route anywhere; the proxy's
container is attached to that network too, and the address it has there names the execution. So a
connection is matched to its execution by the local address it arrived on (nothing the sandbox
sends can claim another identity), and the rule stored for that address decides:

- `CONNECT host:port` (HTTPS and any TLS): tunnelled when the host and port are allowed; the proxy
  never sees inside the TLS session;
- `GET http://host/...` (absolute-form, plain HTTP): forwarded one request per connection, with the
  operator's registered secret headers for that host added on the way (the sandbox never holds
  them). A secret marked `tls` makes the proxy speak HTTPS upstream for such a request, so the
  program asks for `http://host/...` and the secret still never enters the sandbox.

Names resolve here, never in the sandbox; the resolved address must be public unless the operator
allowed its private range, and it is never one of the sandboxes' own networks. Everything else is
answered 403 and reported as a denial on the execution. Per execution the proxy counts
connections and bytes against the rule's limits; connects and idle connections time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from execbox.egress.rules import EgressRule, IpNetwork, address_allowed

log = logging.getLogger(__name__)
HEAD_LIMIT = 64 * 1024
USAGE_PRUNE_AT = 4096
USAGE_KEEP_S = 2 * 3600.0
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "upgrade",
}  # fmt: skip


@dataclass(frozen=True)
class SecretHeader:
    name: str
    value: str
    tls: bool = False
    """Speak HTTPS to the upstream for plain-HTTP requests that carry this secret."""


class RuleSource(Protocol):
    """Where the proxy reads rules and secrets and reports denials (Redis in production)."""

    def rule(self, local_address: str) -> EgressRule | None: ...

    def secrets(self, tenant: str, host: str) -> list[SecretHeader]: ...

    def denied(self, rule: EgressRule, host: str, port: int, reason: str) -> None: ...


@dataclass
class _Usage:
    connections: int = 0
    bytes: int = 0
    seen: float = field(default_factory=time.monotonic)


class Denied(Exception):
    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class EgressProxy:
    def __init__(self, source: RuleSource, private_ok: list[IpNetwork], never: list[IpNetwork]) -> None:
        self._source = source
        self._private_ok = private_ok
        self._never = never
        self._usage: dict[str, _Usage] = {}

    def _usage_for(self, execution_id: str) -> _Usage:
        """This execution's counters; those unused for USAGE_KEEP_S are dropped now and then (a
        rule lives at most its run's timeout plus a margin, so they can no longer be needed)."""
        usage = self._usage.get(execution_id)
        if usage is None:
            if len(self._usage) >= USAGE_PRUNE_AT:
                cutoff = time.monotonic() - USAGE_KEEP_S
                self._usage = {k: u for k, u in self._usage.items() if u.seen >= cutoff}
            usage = self._usage[execution_id] = _Usage()
        usage.seen = time.monotonic()
        return usage

    async def serve(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._handle, host, port, limit=HEAD_LIMIT)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        local = writer.get_extra_info("sockname")[0]
        rule: EgressRule | None = None
        host, port = "", 0
        try:
            rule = await asyncio.to_thread(self._source.rule, local)
            if rule is None:
                raise Denied("no egress rule for this network", 403)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), rule.idle_timeout_s)
            method, target, headers = _parse_head(head)
            if method == "CONNECT":
                host, port, tls = *_split_authority(target, 443), False
            else:
                host, port, tls = _absolute_target(target)
            usage = self._usage_for(rule.execution_id)
            if not rule.allows(host, port):
                raise Denied("not in the execution's allowlist")
            if usage.connections >= rule.max_connections:
                raise Denied(f"connection limit ({rule.max_connections}) reached")
            usage.connections += 1
            secrets = [] if method == "CONNECT" else await asyncio.to_thread(self._source.secrets, rule.tenant, host)
            upstream_port = port
            if not tls and any(s.tls for s in secrets):  # http:// asked, the secret's host wants HTTPS
                tls, upstream_port = True, 443 if port == 80 else port
            upstream_r, upstream_w = await self._connect(rule, host, upstream_port, tls)
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                forwarded = _forward_head(method, target, headers, host, port, secrets)
                usage.bytes += len(forwarded)
                upstream_w.write(forwarded)
            over = await _pipe(rule, usage, (reader, writer), (upstream_r, upstream_w))
            if over:
                await asyncio.to_thread(self._source.denied, rule, host, port, f"byte limit ({rule.max_bytes}) reached")
        except Denied as exc:
            if rule is not None and exc.status == 403:
                await asyncio.to_thread(self._source.denied, rule, host, port, exc.reason)
            await _answer(writer, exc.status, exc.reason)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass  # the client went away, sent no complete request head, or idled
        except Exception:  # one bad connection must not stop the proxy
            log.exception("egress connection failed")
            await _answer(writer, 502, "proxy error")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _connect(
        self, rule: EgressRule, host: str, port: int, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), rule.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise Denied(f"cannot resolve {host}", 502) from exc
        addresses = [str(info[4][0]) for info in infos]
        usable = [a for a in addresses if address_allowed(a, self._private_ok, self._never)]
        if not usable:
            raise Denied(f"{host} resolves only to non-public addresses ({', '.join(sorted(set(addresses)))})")
        context = ssl.create_default_context() if tls else None
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(usable[0], port, ssl=context, server_hostname=host if tls else None),
                rule.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise Denied(f"cannot connect to {host}:{port} ({exc.__class__.__name__})", 502) from exc


async def _pipe(
    rule: EgressRule,
    usage: _Usage,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> bool:
    """Copy both ways until the upstream is done (or the client, then the upstream); True when the
    execution's byte limit cut the connection."""
    over = asyncio.Event()

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while not over.is_set():
                chunk = await asyncio.wait_for(src.read(65536), rule.idle_timeout_s)
                if not chunk:
                    break
                usage.bytes += len(chunk)
                if usage.bytes > rule.max_bytes:
                    over.set()
                    break
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, TimeoutError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                if dst.can_write_eof():
                    dst.write_eof()

    outbound = asyncio.ensure_future(copy(client[0], upstream[1]))
    inbound = asyncio.ensure_future(copy(upstream[0], client[1]))
    try:
        # The upstream finishing ends the exchange; the client finishing sending does not (a
        # response may still come), so then the upstream's side is awaited too.
        done, _ = await asyncio.wait({outbound, inbound}, return_when=asyncio.FIRST_COMPLETED)
        if inbound not in done:
            await inbound
    finally:
        outbound.cancel()
        inbound.cancel()
        upstream[1].close()
    return over.is_set()


def _parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Denied("malformed request line", 400)
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise Denied("malformed header", 400)
            headers.append((name.strip(), value.strip()))
    return parts[0].upper(), parts[1], headers


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    host, sep, port = authority.rpartition(":")
    if not sep:
        host, port = authority, str(default_port)
    if not host or "[" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Denied(f"bad target {authority!r} (host:port, IPv6 literals not supported)", 400)
    return host.lower(), int(port)


def _absolute_target(target: str) -> tuple[str, int, bool]:
    url = urlsplit(target)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise Denied("send absolute-form requests (http://host/path) or CONNECT host:port", 400)
    tls = url.scheme == "https"
    host, port = _split_authority(url.netloc.rpartition("@")[2], 443 if tls else 80)
    return host, port, tls


def _forward_head(
    method: str, target: str, headers: list[tuple[str, str]], host: str, port: int, secrets: list[SecretHeader]
) -> bytes:
    url = urlsplit(target)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    replaced = {s.name.lower() for s in secrets} | _HOP_BY_HOP | {"host"}
    kept = [(n, v) for n, v in headers if n.lower() not in replaced]
    authority = host if port in (80, 443) else f"{host}:{port}"
    lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}", *(f"{n}: {v}" for n, v in kept)]
    lines += [f"{s.name}: {s.value}" for s in secrets] + ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"execbox egress: {reason}\n".encode()
    title = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(Exception):
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
