"""An execution's live events: a Redis Stream per execution (`live:{id}`), read as SSE.

Events, in order: `status` (queued, running, and the terminal status), `stdout` / `stderr` as the
program writes (coalesced over LIVE_FLUSH_S; `{"text"}` decoded as UTF-8 across chunk
boundaries, with U+FFFD for bytes that are not, the stored record keeps the exact bytes), one
`truncated` per stream when its cap is passed (nothing more of that stream follows), a `result`
per rich result, and exactly one `end`, which the SSE route answers with the finished execution as
GET returns it (the stream holds only the mark, not a second copy of the record). Status, result
and end events are written in the same transaction as the status change that causes them
(execbox.executions.store), so a reader never sees an end without the record, or the reverse.

Each event's stream id is its SSE `id:`, so `Last-Event-ID` resumes exactly after the last event
seen. The stream is capped (~STREAM_MAXLEN entries; a reader resuming from before an entry the cap
dropped is told with a `gap` event) and expires with the record.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis

from execbox.core.errors import ServiceError
from execbox.core.redis import redis_errors, text
from execbox.executions.keys import ExecutionKeys

log = logging.getLogger(__name__)
STREAM_MAXLEN = 10_000
LIVE_FLUSH_S = 0.05
LIVE_CHUNK = 16 << 10
END = "end"
STREAMS = {1: "stdout", 2: "stderr"}


def append(
    pipe: redis.client.Pipeline, keys: ExecutionKeys, execution_id: str, event: str, data: Any, ttl_s: int
) -> None:
    """Queue one event on a pipeline (the caller's transaction)."""
    key = keys.stream(execution_id)
    pipe.xadd(key, {"event": event, "data": json.dumps(data)}, maxlen=STREAM_MAXLEN, approximate=True)
    pipe.expire(key, ttl_s)


def so_far(client: redis.Redis, keys: ExecutionKeys, execution_id: str, limit: int = 1 << 20) -> dict[str, str]:
    """The stdout and stderr a running execution has written so far (from its live events), each
    cut at `limit` characters: what a page shows before the record has the output."""
    parts: dict[str, list[str]] = {name: [] for name in STREAMS.values()}
    sizes = dict.fromkeys(parts, 0)
    with redis_errors():
        entries = client.xrange(keys.stream(execution_id), count=STREAM_MAXLEN)
    for _, raw in entries or []:
        fields = {text(k): text(v) for k, v in (raw or {}).items()}
        name = fields.get("event", "")
        if name in parts and sizes[name] < limit:
            piece = str(json.loads(fields.get("data", "{}")).get("text", ""))[: limit - sizes[name]]
            parts[name].append(piece)
            sizes[name] += len(piece)
    return {name: "".join(pieces) for name, pieces in parts.items()}


class LiveOutput:
    """The worker's writer of one run's stdout and stderr events: coalesced, capped, flushed by a
    thread of its own (a slow Redis never blocks the reader of the sandbox's streams)."""

    def __init__(self, client: redis.Redis, keys: ExecutionKeys, execution_id: str, cap: int, ttl_s: int) -> None:
        self._client, self._keys, self._id, self._cap, self._ttl = client, keys, execution_id, cap, ttl_s
        self._pending: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in STREAMS}
        self._seen = {1: 0, 2: 0}
        self._truncated: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"live-{execution_id}", daemon=True)
        self._thread.start()

    def write(self, fd: int, data: bytes) -> None:
        """Called with each piece of output as it arrives (any thread)."""
        if fd not in STREAMS:
            return
        with self._lock:
            room = self._cap - self._seen[fd]
            self._seen[fd] += len(data)
            self._pending[fd] += data[: max(room, 0)]
            if len(self._pending[fd]) >= LIVE_CHUNK or (room < len(data) and fd not in self._truncated):
                self._wake.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(LIVE_FLUSH_S)
            self._wake.clear()
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        events: list[tuple[str, Any]] = []
        with self._lock:
            for fd, name in STREAMS.items():
                chunk = bytes(self._pending[fd])
                self._pending[fd].clear()
                decoded = self._decoders[fd].decode(chunk, final=final)
                if decoded:
                    events.append((name, {"text": decoded}))
                if self._seen[fd] > self._cap and fd not in self._truncated:
                    self._truncated.add(fd)
                    events.append(("truncated", {"stream": name, "cap_bytes": self._cap}))
        if not events:
            return
        try:
            with redis_errors(), self._client.pipeline(transaction=False) as pipe:
                for event, data in events:
                    append(pipe, self._keys, self._id, event, data, self._ttl)
                pipe.execute()
        except ServiceError as exc:  # live output is best effort: the record keeps the output
            log.warning("live output not written: %s", exc.message)

    def close(self) -> None:
        """Flush what is left (before the terminal status is stored, so it precedes `end`)."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._flush(final=True)


async def read(
    client: aioredis.Redis, keys: ExecutionKeys, execution_id: str, after: str, block_ms: int
) -> AsyncIterator[tuple[str, str, str] | None]:
    """(id, event, data JSON) from the stream after `after` ("0" for all), until `end`; None
    each time block_ms passes without one (the caller sends a keepalive)."""
    key = keys.stream(execution_id)
    last = after
    if after != "0":
        with redis_errors():
            info: Any = await client.xinfo_stream(key) if await client.exists(key) else {}
            newest: Any = await client.xrevrange(key, count=1)
        deleted = info.get("max-deleted-entry-id")
        if deleted and _before(after, text(deleted)):
            yield ("", "gap", json.dumps({"message": "some events after Last-Event-ID were dropped (stream cap)"}))
        if newest and not _before(after, text(newest[0][0])):
            # Resuming at or past the newest event: nothing can follow an end, and an id past the
            # newest was never sent (reading after it would wait for ids that will never come).
            newest_id, raw = text(newest[0][0]), {text(k): text(v) for k, v in newest[0][1].items()}
            if raw["event"] == END:
                yield newest_id, END, raw["data"]
                return
            last = newest_id
    while True:
        with redis_errors():
            got: Any = await client.xread({key: last}, count=500, block=block_ms)
        if not got:
            yield None
            continue
        for entry_id, raw in got[0][1]:
            last = text(entry_id)
            fields = {text(k): text(v) for k, v in raw.items()}
            yield last, fields["event"], fields["data"]
            if fields["event"] == END:
                return


MAX_ID_PART = 2**64 - 1


def check_id(value: str) -> None:
    """ValueError unless `value` is a stream id Redis accepts (`<ms>-<seq>`, each below 2^64)."""
    left, sep, right = value.partition("-")
    if not (sep and left.isdigit() and right.isdigit()) or max(int(left), int(right)) > MAX_ID_PART:
        raise ValueError(f"{value[:60]!r} is not an event id: `<ms>-<seq>`, each at most {MAX_ID_PART}")


def _before(a: str, b: str) -> bool:
    """Stream id a sorts before stream id b."""
    left, right = (tuple(int(x) for x in i.split("-", 1)) for i in (a, b))
    return left < right
