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

import h11

from execbox.core.httpheads import (  # fmt: skip
    HEAD_LIMIT,
    ClientRequest,
    MalformedRequest,
    body_chunks,
    hold_current_task,
    read_request,
)
from execbox.egress.rules import EgressRule, IpNetwork, address_allowed

log = logging.getLogger(__name__)
USAGE_PRUNE_AT = 4096
USAGE_KEEP_S = 2 * 3600.0
_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
    b"trailer", b"upgrade",
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
        hold_current_task()
        local = writer.get_extra_info("sockname")[0]
        rule: EgressRule | None = None
        host, port = "", 0
        try:
            rule = await asyncio.to_thread(self._source.rule, local)
            if rule is None:
                raise Denied("no egress rule for this network", 403)
            try:
                client = await read_request(reader, rule.idle_timeout_s)
            except MalformedRequest as exc:
                raise Denied(exc.reason, 400) from exc
            request = client.request
            method, target = request.method.decode("latin-1").upper(), request.target.decode("latin-1")
            if method == "CONNECT":
                host, port, tls = *_split_authority(target, 443), False
            else:
                host, port, tls = _absolute_target(target)
            _check_host_header(request, host, port, tls)
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
                early, _ = client.conn.trailing_data  # bytes the client sent before our answer
                if early:
                    usage.bytes += len(early)
                    upstream_w.write(early)
                over = await _pipe(rule, usage, (reader, writer), (upstream_r, upstream_w))
            else:
                over = await _forward(
                    rule, usage, client, (reader, writer), (upstream_r, upstream_w), host, port, secrets
                )
            if over:
                await asyncio.to_thread(self._source.denied, rule, host, port, f"byte limit ({rule.max_bytes}) reached")
        except Denied as exc:
            if rule is not None and exc.status in (400, 403):
                await asyncio.to_thread(self._source.denied, rule, host, port, exc.reason)
            await _answer(writer, exc.status, exc.reason)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
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
    request_done: bool = False,
) -> bool:
    """Copy both ways until the upstream is done (or the client, then the upstream); True when the
    execution's byte limit cut the connection. With `request_done` only the response flows: the
    client's further bytes are never forwarded."""
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

    inbound = asyncio.ensure_future(copy(upstream[0], client[1]))
    if request_done:
        try:
            await inbound
        finally:
            inbound.cancel()
            upstream[1].close()
        return over.is_set()
    outbound = asyncio.ensure_future(copy(client[0], upstream[1]))
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


def _check_host_header(request: h11.Request, host: str, port: int, tls: bool) -> None:
    """A Host header must name the target the request line names (else a server behind an allowed
    name could be asked for another virtual host than the one checked)."""
    given = [value.decode("latin-1") for name, value in request.headers if name == b"host"]
    if not given:
        return
    try:
        named, named_port = _split_authority(given[0], 443 if tls else 80)
    except Denied as exc:
        raise Denied(f"Host header {given[0]!r} is not host[:port]", 400) from exc
    if (named, named_port) != (host, port):
        raise Denied(f"Host header {given[0]!r} does not match the request target {host}:{port}", 400)


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


async def _forward(
    rule: EgressRule,
    usage: _Usage,
    client: ClientRequest,
    downstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    host: str,
    port: int,
    secrets: list[SecretHeader],
) -> bool:
    """One plain-HTTP request: a head of our own making, then exactly the body h11 framed (nothing
    the client sends after it reaches the upstream), then the response back. True when the byte
    limit cut it."""
    out = h11.Connection(h11.CLIENT)
    writer = upstream[1]

    def send(event: h11.Event) -> bool:
        data = out.send(event) or b""
        usage.bytes += len(data)
        if usage.bytes > rule.max_bytes:
            return False
        writer.write(data)
        return True

    if not send(_upstream_request(client.request, host, port, secrets)):
        upstream[1].close()
        return True
    try:
        async for chunk in body_chunks(client, downstream[0], rule.idle_timeout_s):
            if not send(h11.Data(data=chunk)):
                upstream[1].close()
                return True
    except MalformedRequest as exc:
        upstream[1].close()
        raise Denied(exc.reason, 400) from exc
    send(h11.EndOfMessage())
    await writer.drain()
    return await _pipe(rule, usage, downstream, upstream, request_done=True)


def _upstream_request(request: h11.Request, host: str, port: int, secrets: list[SecretHeader]) -> h11.Request:
    target = urlsplit(request.target.decode("latin-1"))
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    replaced = {s.name.lower().encode() for s in secrets} | _HOP_BY_HOP | {b"host"}
    kept = [(n, v) for n, v in request.headers if n not in replaced]
    authority = host if port in (80, 443) else f"{host}:{port}"
    headers = [(b"Host", authority.encode()), *kept, *((s.name.encode(), s.value.encode()) for s in secrets)]
    return h11.Request(method=request.method, target=path.encode(), headers=[*headers, (b"Connection", b"close")])


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"execbox egress: {reason}\n".encode()
    title = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(Exception):
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
