"""`execbox docker-proxy`: the worker's Docker socket, narrowed (see execbox.dockerproxy.rules).

Listens on a unix socket the worker mounts instead of the engine's. Each request head is parsed
strictly (execbox.core.httpheads), routed, checked (bodies of container and network creates, updates
and connects, parsed strictly and forwarded as re-encoded from what was checked; listings' label
filters; inspected images; ownership of every container or network named in the path, resolved to
its full id through the engine and forwarded by that id), then sent to the engine as a head of the
proxy's own making with exactly that body and `Connection: close`. Attach requests switch to a raw
stream both ways, as the engine does; every other answer is passed back as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from typing import Any
from urllib.parse import quote

import h11
import httpx

from execbox.core.httpheads import ClientRequest, MalformedRequest, body_chunks, hold_current_task, read_request
from execbox.dockerproxy import containers, networks, rules
from execbox.dockerproxy.shape import Shape

log = logging.getLogger(__name__)
BODY_LIMIT = 1 << 20
"""Largest checked body (create, update, connect): far above any the worker sends."""
_CHECKED = {"create", "update", "network-create", "network-connect"}


class DockerProxy:
    def __init__(
        self,
        engine_socket: str,
        deployment: str,
        egress_container: str,
        shape: Shape,
        egress_service: str | None = None,
    ) -> None:
        self._engine = engine_socket
        self._deployment = deployment
        self._shape = shape
        """What a sandbox of this deployment may be (uids, seccomp profiles, the policies' ceilings)."""
        self._egress = egress_container
        self._egress_service = egress_service
        """On a Swarm node: the egress proxy is this service's task on this engine, whose container
        name Swarm chooses; workers still say `egress_container`, and the proxy connects the task."""
        self._owned: dict[tuple[str, str], str] = {}
        """(kind, id or name) -> full id, for objects already seen to be this deployment's."""
        self._inspect = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=engine_socket), base_url="http://docker", timeout=30.0
        )
        """The proxy's own inspections of containers and networks (ownership checks)."""

    async def serve(self, path: str) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(self._handle, path)
        os.chmod(path, 0o660)
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hold_current_task()
        try:
            client = await read_request(reader, 60.0)
            await self._serve(client, reader, writer)
        except rules.Refused as exc:
            log.warning("docker call refused: %s", exc.reason)
            await _answer(writer, 403, exc.reason)
        except MalformedRequest as exc:
            await _answer(writer, 400, exc.reason)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        except Exception:
            log.exception("docker proxy connection failed")
            await _answer(writer, 502, "docker proxy error")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, client: ClientRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = client.request
        method, target = request.method.decode(), request.target.decode("latin-1")
        route = rules.route(method, target)
        headers = {name.decode().lower(): value.decode("latin-1") for name, value in request.headers}
        if "transfer-encoding" in headers:
            raise rules.Refused("Transfer-Encoding", "chunked request bodies are not used by workers")
        if route.scope == "listing":
            rules.check_listing(target.partition("?")[2], self._deployment)
        elif route.scope == "image":
            rules.check_image(route.object_id or "")
        elif route.object_id is not None:
            kind = "networks" if route.scope.startswith("network") else "containers"
            full = await self._owned_id(kind, route.object_id)
            target = target.replace(f"/{route.object_id}", f"/{full}", 1)
        body = b""
        if route.scope in _CHECKED:
            body = await _read_body(client, reader, int(headers.get("content-length") or 0))
            body = await self._check(route.scope, body)
        await self._forward(client, reader, writer, method, target, body, route.scope in _CHECKED)

    async def _check(self, scope: str, body: bytes) -> bytes:
        """Refuse what a worker may not ask; the body to forward: what was checked, encoded again (the
        engine reads exactly that), with the egress proxy's container resolved on a Swarm node."""
        data: Any = rules.decode(body)
        if not isinstance(data, dict):
            raise rules.Refused("body", "must be a JSON object")
        if scope == "create":
            host = data.get("HostConfig")
            network = host.get("NetworkMode") if isinstance(host, dict) else None
            ours = isinstance(network, str) and network != "none" and await self._is_ours("networks", network)
            containers.check_create(data, self._deployment, lambda name: ours and name == network, self._shape)
        elif scope == "update":
            containers.check_update(data, self._shape)
        elif scope == "network-create":
            networks.check_network_create(data, self._deployment, self._shape.subnet_pool)
        else:
            networks.check_connect(data, self._egress, self._shape.subnet_pool)
            if self._egress_service is not None:
                data["Container"] = await self._egress_task()
        return json.dumps(data).encode()

    async def _egress_task(self) -> str:
        """The running container of the egress service's task on this engine (a Swarm node runs one)."""
        labels = json.dumps({"label": [f"com.docker.swarm.service.name={self._egress_service}"], "status": ["running"]})
        status, found = await self._engine_get(f"/containers/json?filters={quote(labels)}")
        if status != 200 or not found:
            raise rules.Refused("Container", f"no running task of the egress service {self._egress_service!r} here")
        return str(found[0]["Id"])

    async def _is_ours(self, kind: str, name: str) -> bool:
        try:
            await self._owned_id(kind, name)
        except rules.Refused:
            return False
        return True

    async def _owned_id(self, kind: str, name: str) -> str:
        cached = self._owned.get((kind, name))
        if cached is not None:
            return cached
        status, data = await self._engine_get(f"/{kind}/{name}" + ("/json" if kind == "containers" else ""))
        labels = (data.get("Config") or {}).get("Labels") if kind == "containers" else data.get("Labels")
        if status != 200 or not rules.ours(labels, self._deployment):
            raise rules.Refused(kind[:-1], f"{name!r} is not one of this deployment's")
        full = str(data.get("Id"))
        if len(self._owned) > 10_000:
            self._owned.clear()  # ids are never reused; the cache only saves lookups
        self._owned[(kind, name)] = full
        return full

    async def _engine_get(self, path: str) -> tuple[int, Any]:
        """The engine's status and JSON answer (an object, or a list for a listing); 0 and {} when
        it did not answer or answered something else."""
        try:
            answer = await self._inspect.get(path)
            return answer.status_code, answer.json()
        except (httpx.HTTPError, ValueError):
            return 0, {}

    async def _forward(
        self,
        client: ClientRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        body: bytes,
        body_read: bool,
    ) -> None:
        request = client.request
        upgrade = any(n == b"upgrade" for n, _ in request.headers)
        dropped = (b"connection", b"host", b"keep-alive", *((b"content-length",) if body_read else ()))
        kept = [(n, v) for n, v in request.headers if n.lower() not in dropped]
        headers = [(b"Host", b"docker"), *kept, (b"Connection", b"Upgrade" if upgrade else b"close")]
        if body_read:  # a checked body may have been rewritten
            headers.append((b"Content-Length", str(len(body)).encode()))
        out = h11.Connection(h11.CLIENT)
        engine_r, engine_w = await asyncio.open_unix_connection(self._engine)
        try:
            engine_w.write(out.send(h11.Request(method=method, target=target, headers=headers)) or b"")
            if body_read:
                engine_w.write(out.send(h11.Data(data=body)) or b"")
            else:
                await _copy_body(client, reader, engine_w, out)
            engine_w.write(out.send(h11.EndOfMessage()) or b"")
            await engine_w.drain()
            if upgrade:  # attach: the engine answers 101 and then it is a raw stream both ways
                early, _ = client.conn.trailing_data
                if early:
                    engine_w.write(early)
                await _both_ways((reader, writer), (engine_r, engine_w))
            else:
                await _one_way(engine_r, writer)
        finally:
            engine_w.close()


async def _read_body(client: ClientRequest, reader: asyncio.StreamReader, length: int) -> bytes:
    if length > BODY_LIMIT:
        raise rules.Refused("Content-Length", f"a {length}-byte body is larger than any a worker sends")
    return b"".join([chunk async for chunk in body_chunks(client, reader, 60.0)])


async def _copy_body(
    client: ClientRequest, reader: asyncio.StreamReader, engine: asyncio.StreamWriter, out: h11.Connection
) -> None:
    """An unchecked body (an input archive): streamed as framed, never more."""
    async for chunk in body_chunks(client, reader, 60.0):
        engine.write(out.send(h11.Data(data=chunk)) or b"")
        await engine.drain()


async def _one_way(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while chunk := await source.read(65536):
        sink.write(chunk)
        await sink.drain()


async def _both_ways(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter], engine: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()  # the worker's stdin end (shutdown) reaches the engine

    inbound = asyncio.ensure_future(copy(engine[0], client[1]))
    outbound = asyncio.ensure_future(copy(client[0], engine[1]))
    try:
        await inbound  # the stream ends when the engine ends it
    finally:
        outbound.cancel()


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = json.dumps({"message": f"execbox docker-proxy: {reason}"}).encode()
    head = f"HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(Exception):
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()


def run(
    listen: str, engine: str, deployment: str, egress_container: str, shape: Shape, egress_service: str | None = None
) -> None:
    """Serve until stopped; `shape` comes from the workers' own settings (EXECBOX_POLICIES_DIR,
    EXECBOX_DOCKER__*): the proxy runs with the same environment as the deployment's workers."""

    async def serve() -> None:
        proxy = DockerProxy(engine, deployment, egress_container, shape, egress_service)
        server = await proxy.serve(listen)
        log.info("docker proxy listening on %s for deployment %s", listen, deployment)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())
