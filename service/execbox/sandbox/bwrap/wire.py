"""The frames between a worker and its host's bubblewrap helper, on one unix-socket connection per run.

Each frame is a kind byte, a 4-byte big-endian length and that many bytes. The worker sends HEAD
(the run, JSON) first, then STDIN frames and STDIN_END as the program's stdin goes, and KILL,
COLLECT and RELEASE when it decides to. The helper answers OUT and ERR (the program's streams as
they come), EXIT (JSON: "started"; "exited" with the launcher's status and the run's OOM kills;
"released" with whether its uid is free), TAR frames and one TAR_END (JSON: an error or null, and
whether the listing was cut) for a COLLECT, and FAILED (JSON: why the helper could not run it).

stdin is flow-controlled: the worker may have at most STDIN_WINDOW bytes of STDIN sent that the
helper has not yet written to the program; the helper answers CREDIT (8 bytes, big-endian: how many
it wrote) as it writes. So the root helper never holds more than the window of one run's unread
stdin, and the connection never stalls behind stdin: KILL, COLLECT and RELEASE always get through.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

HEAD, STDIN, STDIN_END, KILL, COLLECT, RELEASE = range(1, 7)
OUT, ERR, EXIT, TAR, TAR_END, FAILED, CREDIT = range(11, 18)
MAX_FRAME = 1 << 20
"""Largest frame either side sends or accepts (a HEAD is far smaller; data goes in pieces)."""
STDIN_WINDOW = 1 << 20
"""stdin bytes sent and not yet written to the program, at most (the helper's memory per run)."""
STDIN_PIECE = 1 << 16
"""The size of the worker's STDIN frames (a window holds several, so the pipe stays busy)."""
_HEADER = struct.Struct(">BI")
_CREDIT = struct.Struct(">Q")


class WireError(Exception):
    """The peer broke the protocol or went away."""


def pack(kind: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


def pack_json(kind: int, value: Any) -> bytes:
    return pack(kind, json.dumps(value, separators=(",", ":")).encode())


def pack_credit(size: int) -> bytes:
    return pack(CREDIT, _CREDIT.pack(size))


def parse_credit(payload: bytes) -> int:
    if len(payload) != _CREDIT.size:
        raise WireError(f"a CREDIT frame of {len(payload)} bytes")
    return int(_CREDIT.unpack(payload)[0])


def _recv(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireError("the frame did not arrive within its deadline")
        sock.settimeout(left)
    try:
        return sock.recv(size)
    except TimeoutError:
        raise WireError("the frame did not arrive within its deadline") from None


def _exactly(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    chunks, left = [], size
    while left:
        chunk = _recv(sock, min(left, 1 << 16), deadline)
        if not chunk:
            raise WireError("the connection closed in the middle of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read(sock: socket.socket, deadline: float | None = None) -> tuple[int, bytes] | None:
    """The next frame, or None at a clean end of the connection. With a deadline (time.monotonic()),
    the whole frame must have arrived by then, however it trickles in (WireError if not)."""
    first = _recv(sock, 1, deadline)
    if not first:
        return None
    kind, size = _HEADER.unpack(first + _exactly(sock, _HEADER.size - 1, deadline))
    if size > MAX_FRAME:
        raise WireError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return kind, _exactly(sock, size, deadline)


def parse_json(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"{what} is not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise WireError(f"{what} is not a JSON object")
    return value


__all__ = [
    "COLLECT",
    "CREDIT",
    "ERR",
    "EXIT",
    "FAILED",
    "HEAD",
    "KILL",
    "MAX_FRAME",
    "OUT",
    "RELEASE",
    "STDIN",
    "STDIN_END",
    "STDIN_PIECE",
    "STDIN_WINDOW",
    "TAR",
    "TAR_END",
    "WireError",
    "pack",
    "pack_credit",
    "pack_json",
    "parse_credit",
    "parse_json",
    "read",
]
