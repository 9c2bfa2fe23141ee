"""Strict parsing of HTTP/1.1 request heads at a trust boundary (the egress proxy, the Docker
socket proxy): h11, after a byte-level check of what h11 tolerates or merges but some servers
behind us would read otherwise (bare LF or CR, obs-fold, NUL, duplicate Host or framing headers,
both Content-Length and Transfer-Encoding)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import h11

HEAD_LIMIT = 64 * 1024


_LIVE: set[asyncio.Task[object]] = set()


def hold_current_task() -> asyncio.Task[object] | None:
    """Keep the running connection handler referenced until it ends. asyncio's stream server drops
    its reference when the client's side closes, and a handler then waiting only on the other side
    (an upstream or the engine) could be garbage-collected mid-copy, cutting that stream."""
    task = asyncio.current_task()
    if task is not None:
        _LIVE.add(task)
        task.add_done_callback(_LIVE.discard)
    return task


class MalformedRequest(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ClientRequest:
    """A request head h11 accepted, and the connection state that parses the rest (its body)."""

    conn: h11.Connection
    request: h11.Request


async def read_request(reader: asyncio.StreamReader, timeout_s: float) -> ClientRequest:
    """Read and parse one request head, strictly: what any server behind us might read differently
    (bare LF or CR, obs-fold, duplicate or conflicting framing or Host headers) is refused."""
    buffer = b""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        if b"\n\n" in buffer or b"\n\r\n" in buffer:
            raise MalformedRequest("malformed request head (bare LF line ending)")
        if len(buffer) > HEAD_LIMIT:
            raise MalformedRequest(f"request head larger than {HEAD_LIMIT} bytes")
        chunk = await asyncio.wait_for(reader.read(65536), timeout_s)
        if not chunk:
            raise asyncio.IncompleteReadError(buffer, None)
        buffer += chunk
    check_head_bytes(buffer[:end])
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
    conn.receive_data(buffer)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise MalformedRequest(f"malformed request head ({exc})") from exc
    if not isinstance(event, h11.Request):
        raise MalformedRequest("malformed request head")
    return ClientRequest(conn, event)


_FRAMING = (b"host", b"content-length", b"transfer-encoding")


def check_head_bytes(head: bytes) -> None:
    """What h11 tolerates (or merges) but some upstreams read otherwise: every line ends in CRLF,
    no stray CR or LF inside a line, no continuation lines, no NUL; Host and the body's framing
    given once, and never both framings."""
    counts = dict.fromkeys(_FRAMING, 0)
    for index, line in enumerate(head.split(b"\r\n")):
        if b"\n" in line or b"\r" in line:
            raise MalformedRequest("malformed request head (bare LF or CR inside a line)")
        if b"\x00" in line:
            raise MalformedRequest("malformed request head (NUL byte)")
        if index and line[:1] in (b" ", b"\t"):
            raise MalformedRequest("malformed request head (obsolete line folding)")
        name = line.partition(b":")[0].lower()
        if index and name in counts:
            counts[name] += 1
    for name, count in counts.items():
        if count > 1:
            raise MalformedRequest(f"duplicate {name.decode()} header")
    if counts[b"content-length"] and counts[b"transfer-encoding"]:
        raise MalformedRequest("both Content-Length and Transfer-Encoding")


async def body_chunks(client: ClientRequest, reader: asyncio.StreamReader, timeout_s: float) -> AsyncIterator[bytes]:
    """The request's body as h11 frames it (Content-Length or chunked), chunk by chunk; ends at the
    end of the message (or where the connection may switch protocols), never later: bytes the
    client sends behind the body are not part of it."""
    while True:
        try:
            event = client.conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise MalformedRequest(f"malformed request body ({exc})") from exc
        if event is h11.NEED_DATA:
            data = await asyncio.wait_for(reader.read(65536), timeout_s)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            client.conn.receive_data(data)
        elif isinstance(event, h11.Data):
            yield bytes(event.data)
        elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
            return


__all__ = [
    "HEAD_LIMIT",
    "ClientRequest",
    "MalformedRequest",
    "body_chunks",
    "check_head_bytes",
    "hold_current_task",
    "read_request",
]
