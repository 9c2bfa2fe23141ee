"""Egress rules and the proxy's protocol handling, on loopback with an in-memory rule source."""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import replace

import pytest

from execbox.egress.proxy import EgressProxy, SecretHeader
from execbox.egress.rules import EgressRule, HostPattern, IpNetwork, address_allowed, uncovered

LOOPBACK: list[IpNetwork] = [ipaddress.ip_network("127.0.0.0/8")]
RULE = EgressRule(
    execution_id="exe_" + "a" * 26, tenant="alpha", trace_id="t" * 32, allow=("localhost",),
    max_connections=5, max_bytes=1 << 20, connect_timeout_s=2, idle_timeout_s=5,
)  # fmt: skip


def test_patterns_match_hosts_and_ports() -> None:
    exact, wild, ported = (HostPattern.parse(p) for p in ("api.example.com", "*.pypi.org", "files.example.org:8443"))
    assert exact.matches("API.example.com.", 443) and exact.matches("api.example.com", 80)
    assert not exact.matches("api.example.com", 8080) and not exact.matches("x.api.example.com", 443)
    assert wild.matches("files.pypi.org", 443) and not wild.matches("pypi.org", 443)
    assert not wild.matches("evil-pypi.org", 443)
    assert ported.matches("files.example.org", 8443) and not ported.matches("files.example.org", 443)
    for bad in ("", "*", "a..b", "-a.com", "a.com:0", "a.com:70000", "*.*.com", "http://a.com", "a.com/x"):
        with pytest.raises(ValueError):
            HostPattern.parse(bad)


def test_operator_patterns_cover_requests() -> None:
    operator = ["*.example.com", "files.example.org:8443", "pypi.org"]
    requested = ["api.example.com", "*.a.example.com", "*.example.com", "example.com", "files.example.org",
                 "files.example.org:8443", "pypi.org:443", "pypi.org:8080"]  # fmt: skip
    assert uncovered(requested, operator) == [3, 4, 7]


def test_only_public_or_operator_allowed_addresses() -> None:
    never = [ipaddress.ip_network("10.213.0.0/16")]
    assert address_allowed("93.184.216.34", [], never)
    for internal in ("127.0.0.1", "10.0.0.5", "172.17.0.1", "192.168.1.1", "169.254.169.254", "::1", "100.64.0.1"):
        assert not address_allowed(internal, [], never), internal
    assert address_allowed("172.17.0.5", [ipaddress.ip_network("172.17.0.0/16")], never)
    assert not address_allowed("10.213.0.3", [ipaddress.ip_network("10.0.0.0/8")], never)


class Source:
    def __init__(self, rule: EgressRule | None, secrets: list[SecretHeader] | None = None) -> None:
        self._rule = rule
        self._secrets = secrets or []
        self.denials: list[tuple[str, int, str]] = []

    def rule(self, local_address: str) -> EgressRule | None:
        return self._rule if local_address == "127.0.0.1" else None

    def secrets(self, tenant: str, host: str) -> list[SecretHeader]:
        return self._secrets if (tenant, host) == ("alpha", "localhost") else []

    def denied(self, rule: EgressRule, host: str, port: int, reason: str) -> None:
        self.denials.append((host, port, reason))


async def _upstream() -> tuple[asyncio.Server, int, list[bytes]]:
    """An HTTP server that answers with the request head it received; and an echo after CONNECT."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(head) + head)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the proxy closed the connection first (a limit cut it)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


async def _through(proxy_port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


def _run(source: Source, private_ok: list[IpNetwork], *requests: bytes) -> list[bytes]:
    """Start an upstream and the proxy; allow exactly the upstream's (random) port for localhost;
    send each request (PORT stands for the upstream's port) on its own connection."""

    async def scenario() -> list[bytes]:
        upstream, port, _ = await _upstream()
        if source._rule is not None:
            source._rule = replace(source._rule, allow=(f"localhost:{port}",))
        proxy = await EgressProxy(source, private_ok, []).serve("127.0.0.1", 0)
        proxy_port = proxy.sockets[0].getsockname()[1]
        answers = [await _through(proxy_port, r.replace(b"PORT", str(port).encode())) for r in requests]
        proxy.close()
        upstream.close()
        # Let the proxy's connection handlers finish before the loop closes.
        await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)
        return answers

    return asyncio.run(scenario())


def test_plain_http_is_forwarded_with_secret_headers_and_no_proxy_credentials() -> None:
    source = Source(RULE, [SecretHeader("Authorization", "Bearer s3cret")])
    request = (b"GET http://localhost:PORT/data?q=1 HTTP/1.1\r\nHost: localhost:PORT\r\nAuthorization: Bearer fake\r\n"
               b"Proxy-Authorization: Basic eA==\r\n\r\n")  # fmt: skip
    (answer,) = _run(source, LOOPBACK, request)
    assert answer.startswith(b"HTTP/1.1 200 OK")
    forwarded = answer.split(b"\r\n\r\n", 1)[1]
    assert forwarded.startswith(b"GET /data?q=1 HTTP/1.1\r\n")
    assert b"Authorization: Bearer s3cret" in forwarded and b"Bearer fake" not in forwarded
    assert b"Proxy-Authorization" not in forwarded and b"Connection: close" in forwarded
    assert source.denials == []


def test_connect_tunnels_to_allowed_port_and_refuses_others() -> None:
    source = Source(RULE)
    tunnel, other, unknown = _run(
        source,
        LOOPBACK,
        b"CONNECT localhost:PORT HTTP/1.1\r\nHost: localhost:PORT\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT localhost:1 HTTP/1.1\r\nHost: localhost:1\r\n\r\n",
        b"CONNECT elsewhere.example:443 HTTP/1.1\r\nHost: elsewhere.example:443\r\n\r\n",
    )
    assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
    assert other.startswith(b"HTTP/1.1 403") and unknown.startswith(b"HTTP/1.1 403")
    assert [(h, p) for h, p, _ in source.denials] == [("localhost", 1), ("elsewhere.example", 443)]


def test_internal_addresses_need_the_operators_consent() -> None:
    source = Source(RULE)
    (answer,) = _run(source, [], b"CONNECT localhost:PORT HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403")  # allowlisted name, but it resolves to loopback
    assert len(source.denials) == 1 and "non-public" in source.denials[0][2]


def test_limits_and_unknown_networks() -> None:
    source = Source(replace(RULE, max_connections=1))
    connect = b"CONNECT localhost:PORT HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    first, second = _run(source, LOOPBACK, connect + b"GET / HTTP/1.1\r\n\r\n", connect)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 403")
    assert "connection limit" in source.denials[-1][2]
    nobody = Source(None)
    (answer,) = _run(Source(RULE), LOOPBACK, b"garbage\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400")
    (answer,) = _run(nobody, LOOPBACK, b"CONNECT localhost:PORT HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403") and nobody.denials == []


def test_byte_limit_cuts_the_connection_and_is_reported() -> None:
    source = Source(replace(RULE, max_bytes=64))
    request = b"GET http://localhost:PORT/" + b"x" * 100 + b" HTTP/1.1\r\nHost: localhost:PORT\r\n\r\n"
    (answer,) = _run(source, LOOPBACK, request)
    assert len(answer) < 200  # the upstream echoes the ~150-byte head: it never arrives whole
    assert [reason for _, _, reason in source.denials] == ["byte limit (64) reached"]


def test_usage_of_old_executions_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    from execbox.egress import proxy as proxy_mod

    monkeypatch.setattr(proxy_mod, "USAGE_PRUNE_AT", 3)
    egress = EgressProxy(Source(RULE), [], [])
    for name in ("old-1", "old-2"):
        egress._usage_for(name).seen -= proxy_mod.USAGE_KEEP_S + 1
    egress._usage_for("recent")
    egress._usage_for("new")  # the fourth: the two stale ones go
    assert sorted(egress._usage) == ["new", "recent"]


async def _recording_upstream() -> tuple[asyncio.Server, int, list[bytes]]:
    """An HTTP server that answers every request with 200 and then records every byte it received
    until the proxy closes the connection."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.write_eof()
            seen.append(received + await asyncio.wait_for(reader.read(), 5))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the proxy closed the connection first (a limit cut it)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def _exchange(source: Source, request: bytes) -> tuple[bytes, list[bytes]]:
    """One request (PORT: the recording upstream's port) through the proxy: its answer and what the
    upstream received."""

    async def scenario() -> tuple[bytes, list[bytes]]:
        upstream, port, seen = await _recording_upstream()
        source._rule = replace(RULE, allow=(f"localhost:{port}",))
        proxy = await EgressProxy(source, LOOPBACK, []).serve("127.0.0.1", 0)
        answer = await _through(proxy.sockets[0].getsockname()[1], request.replace(b"PORT", str(port).encode()))
        proxy.close()
        upstream.close()
        await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}), return_exceptions=True)
        return answer, seen

    return asyncio.run(scenario())


GET = b"GET http://localhost:PORT/ HTTP/1.1\r\n"
SMUGGLING = {
    "bare LF inside a value": GET + b"Host: localhost:PORT\r\nX: a\nEvil: internal\r\n\r\n",
    "bare LF line endings": b"GET http://localhost:PORT/ HTTP/1.1\nHost: localhost:PORT\n\n",
    "bare CR inside a value": GET + b"Host: localhost:PORT\r\nX: a\rHost: internal\r\n\r\n",
    "obs-fold": GET + b"Host: localhost:PORT\r\nX: a\r\n Host: internal\r\n\r\n",
    "duplicate Host": GET + b"Host: localhost:PORT\r\nHost: internal\r\n\r\n",
    "duplicate Content-Length": GET + b"Host: localhost:PORT\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    "Content-Length and Transfer-Encoding": GET
    + b"Host: localhost:PORT\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "duplicate Transfer-Encoding": GET
    + b"Host: localhost:PORT\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "Host other than the absolute target": GET + b"Host: internal.example\r\n\r\n",
    "CONNECT Host other than its target": b"CONNECT localhost:PORT HTTP/1.1\r\nHost: internal.example:443\r\n\r\n",
    "NUL in a value": GET + b"Host: localhost:PORT\r\nX: a\x00b\r\n\r\n",
    "space before the colon": GET + b"Host: localhost:PORT\r\nHost : internal\r\n\r\n",
}


@pytest.mark.parametrize("shape", sorted(SMUGGLING))
def test_smuggling_shapes_are_refused_and_recorded(shape: str) -> None:
    source = Source(RULE)
    answer, seen = _exchange(source, SMUGGLING[shape])
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert seen == []  # nothing reached the upstream
    assert len(source.denials) == 1 and source.denials[0][2].startswith(("malformed", "duplicate", "both", "Host"))


def test_only_the_framed_body_is_forwarded_never_a_request_behind_it() -> None:
    source = Source(RULE, [SecretHeader("Authorization", "Bearer s3cret")])
    hidden = b"GET /admin HTTP/1.1\r\nHost: internal\r\n\r\n"
    for body_head, body in (
        (b"Content-Length: 5\r\n", b"hello"),
        (b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ):
        request = b"POST http://localhost:PORT/in HTTP/1.1\r\nHost: localhost:PORT\r\n" + body_head + b"\r\n"
        answer, seen = _exchange(source, request + body + hidden)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok")
        (received,) = seen
        head, _, forwarded_body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /in HTTP/1.1\r\n") and b"Authorization: Bearer s3cret" in head
        assert forwarded_body == body and b"/admin" not in received
    assert source.denials == []
