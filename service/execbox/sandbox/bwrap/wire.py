"""The frames between a worker and its host's bubblewrap helper, on one unix-socket connection per run.

Each frame is a kind byte, a 4-byte big-endian length and that many bytes. The worker sends HEAD
(the run, JSON) first, then STDIN frames and STDIN_END as the program's stdin goes, and KILL,
COLLECT and RELEASE when it decides to. The helper answers OUT and ERR (the program's streams as
they come), EXIT (JSON: the launcher's exit status, once it ended), TAR frames and one TAR_END
(JSON: an error or null) for a COLLECT, and FAILED (JSON: why the helper could not run it).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEAD, STDIN, STDIN_END, KILL, COLLECT, RELEASE = range(1, 7)
OUT, ERR, EXIT, TAR, TAR_END, FAILED = range(11, 17)
MAX_FRAME = 1 << 20
"""Largest frame either side sends or accepts (a HEAD is far smaller; data goes in pieces)."""
_HEADER = struct.Struct(">BI")


class WireError(Exception):
    """The peer broke the protocol or went away."""


def pack(kind: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


def pack_json(kind: int, value: Any) -> bytes:
    return pack(kind, json.dumps(value, separators=(",", ":")).encode())


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise WireError("the connection closed in the middle of a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read(sock: socket.socket) -> tuple[int, bytes] | None:
    """The next frame, or None at a clean end of the connection."""
    first = sock.recv(1)
    if not first:
        return None
    kind, size = _HEADER.unpack(first + _exactly(sock, _HEADER.size - 1))
    if size > MAX_FRAME:
        raise WireError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return kind, _exactly(sock, size)


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
    "TAR",
    "TAR_END",
    "WireError",
    "pack",
    "pack_json",
    "parse_json",
    "read",
]
