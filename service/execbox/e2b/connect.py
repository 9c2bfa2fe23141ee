"""The Connect protocol's framing, JSON codec only (what E2B's SDKs speak to envd over HTTP/1.1).

A unary call is a plain JSON body each way. A streaming call's messages (the server's, and a
client stream's) are envelopes: one flags byte, a big-endian 32-bit length, the JSON message; the stream
ends with an envelope flagged END_STREAM holding `{}` or `{"error": {"code", "message"}}`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from execbox.core.errors import FieldProblem, InvalidRequest

STREAM_TYPE = "application/connect+json"
"""Exactly this: the Python SDK compares the header byte for byte (no charset)."""
CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
         405: "unimplemented", 408: "deadline_exceeded", 409: "already_exists", 413: "resource_exhausted",
         429: "resource_exhausted",
         501: "unimplemented", 502: "unavailable", 503: "unavailable", 504: "deadline_exceeded"}  # fmt: skip
"""HTTP status -> Connect error code (the SDKs map the codes to their exceptions; `unavailable`
with "was not found" is E2B's "the sandbox is not running")."""


def connect_code(status: int) -> str:
    return CODES.get(400 if status == 422 else status, "internal" if status >= 500 else "unknown")


END_STREAM = 0x02
COMPRESSED = 0x01
_HEADER = struct.Struct(">BI")


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(data)) + data


def end_stream(code: str | None = None, message: str = "") -> bytes:
    return envelope({"error": {"code": code, "message": message}} if code else {}, END_STREAM)


def opened_envelope(body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request."""
    if len(body) < _HEADER.size:
        raise _bad("the request is not a Connect envelope")
    flags, size = _HEADER.unpack_from(body)
    if flags & COMPRESSED:
        raise _bad("compressed messages are not accepted; send identity")
    if size != len(body) - _HEADER.size:
        raise _bad("the envelope's length does not match the body")
    return message(body[_HEADER.size :])


async def envelopes(chunks: AsyncIterator[bytes], max_size: int) -> AsyncIterator[dict[str, Any]]:
    """A client stream's messages as they arrive (a message over max_size bytes is refused)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        while len(pending) >= _HEADER.size:
            flags, size = _HEADER.unpack_from(pending)
            if flags & COMPRESSED:
                raise _bad("compressed messages are not accepted; send identity")
            if size > max_size:
                raise _bad(f"a message of {size} bytes; at most {max_size}")
            if len(pending) < _HEADER.size + size:
                break
            data, pending = pending[_HEADER.size : _HEADER.size + size], pending[_HEADER.size + size :]
            if not flags & END_STREAM:
                yield message(data)
    if pending:
        raise _bad("the stream ends inside an envelope")


def message(data: bytes) -> dict[str, Any]:
    """One message's JSON object; InvalidRequest (a Connect `invalid_argument`) for anything else,
    nesting past the interpreter's recursion limit included (it was a plain-text 500)."""
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        raise _bad("the message is not JSON") from None
    except RecursionError:
        raise _bad("the message is nested too deeply; send at most a few hundred levels") from None
    if not isinstance(parsed, dict):
        raise _bad("the message must be a JSON object")
    return parsed


def _bad(why: str) -> InvalidRequest:
    return InvalidRequest(why, (FieldProblem("body", why),))


__all__ = [
    "END_STREAM",
    "STREAM_TYPE",
    "connect_code",
    "end_stream",
    "envelope",
    "envelopes",
    "message",
    "opened_envelope",
]
