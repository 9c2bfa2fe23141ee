"""Uploaded and inline input files: meta in Redis (key `file:{id}`), data behind the InputBlobs seam.

The hash holds `meta` (the FilePublic JSON), `blob` (where the data is: `redis` or `s3`) and, for
data kept in Redis, `data`. The hash's TTL is the file's life; executions extend it. A hash without
`blob` was written before data could live elsewhere: its data is in the hash. Data is read back
through `data` or `open`, which check it against the size and sha256 it was stored with.
"""

from __future__ import annotations

import base64
import hashlib
import io
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Protocol, runtime_checkable

import redis

from execbox.core.redis import redis_errors
from execbox.files.blobs import ArtifactTooLarge
from execbox.files.errors import InputStoreUnavailable, InputUnavailable
from execbox.files.keys import FileKeys
from execbox.files.schemas import FilePublic, InputFileRef

_CHUNK = 1 << 16
REDIS = "redis"
ORPHAN_GRACE_S = 600.0
"""An object younger than this is never swept: its meta may be being written right now."""


def new_file_id() -> str:
    return "file_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


class Budget(Protocol):
    """A tenant's storage budget (execbox.tenancy.quotas.Quotas.keep): counts or raises (429)."""

    def __call__(self, tenant: str, nbytes: int, ttl_s: float, what: str) -> object: ...


def _remaining(stream: IO[bytes], limit: int) -> int:
    """Bytes left in a seekable stream (an upload spooled to a file), else `limit`."""
    try:
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
    except (OSError, ValueError):
        return limit
    return end - here


class InputBlobs(Protocol):
    """Where input file data lives. Errors: FileNotFoundError when absent, another OSError when the
    store fails, ArtifactTooLarge past the limit."""

    kind: str
    """Recorded in the file's hash, so a file is always read from where it was written."""

    def put(self, file_id: str, data: IO[bytes], limit: int, ttl_s: int) -> tuple[int, str]:
        """Store at most `limit` bytes, kept at least `ttl_s`; return (size, sha256 hex)."""

    def read(self, file_id: str) -> Iterator[bytes]: ...

    def delete(self, file_id: str) -> None: ...


@runtime_checkable
class SweptBlobs(InputBlobs, Protocol):
    """Blobs that do not expire with their meta: swept once it is gone."""

    def sweep(self, stored_before: float, alive: Callable[[list[str]], list[bool]]) -> int: ...


class RedisHashBlobs:
    """The data in the file's own hash (field `data`): it expires with the meta, nothing to sweep."""

    kind = REDIS

    def __init__(self, client: redis.Redis, keys: FileKeys) -> None:
        self.redis = client
        self.keys = keys

    def put(self, file_id: str, data: IO[bytes], limit: int, ttl_s: int) -> tuple[int, str]:
        raw = data.read(limit + 1)
        if len(raw) > limit:
            raise ArtifactTooLarge(file_id)
        key = self.keys.file(file_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.hset(key, "data", raw)
            pipe.expire(key, ttl_s)
            pipe.execute()
        return len(raw), hashlib.sha256(raw).hexdigest()

    def read(self, file_id: str) -> Iterator[bytes]:
        with redis_errors():
            raw = self.redis.hget(self.keys.file(file_id), "data")
        if raw is None:
            raise FileNotFoundError(file_id)
        yield raw if isinstance(raw, bytes) else raw.encode()

    def delete(self, file_id: str) -> None:
        with redis_errors():
            self.redis.hdel(self.keys.file(file_id), "data")


class FileStore:
    def __init__(self, client: redis.Redis, keys: FileKeys, blobs: InputBlobs | None = None) -> None:
        """`blobs`: where new files' data goes (None: the Redis hash, the one-host default)."""
        self.redis = client
        self.keys = keys
        hashed = RedisHashBlobs(client, keys)
        self.blobs: InputBlobs = blobs or hashed
        self._by_kind: dict[str, InputBlobs] = {REDIS: hashed, self.blobs.kind: self.blobs}
        self.budget: Budget | None = None
        """Counts a file kept in Redis against its tenant's storage budget, or refuses it (the assembly
        sets Quotas.keep); None: not counted."""

    def put(
        self,
        data: bytes | IO[bytes],
        name: str,
        ttl_s: int,
        tenant: str,
        limit: int | None = None,
        counted: bool = True,
    ) -> FilePublic:
        """Store a file: its data first, then its meta, so a meta always has its data. A stream is
        read once, in chunks (at most `limit` bytes, required for a stream). Data kept in Redis is
        counted against the tenant's storage budget first, unless `counted` is False (an execution's
        inline files: the execution counted them)."""
        if isinstance(data, bytes):
            stream: IO[bytes] = io.BytesIO(data)
            limit = len(data)
        elif limit is None:
            raise ValueError("a stream needs a limit")
        else:
            stream = data
        if counted and self.budget is not None and self.blobs.kind == REDIS:
            self.budget(tenant, min(_remaining(stream, limit), limit), ttl_s, "this file")
        file_id = new_file_id()
        with _store_errors(file_id, "store", name):
            size, sha256 = self.blobs.put(file_id, stream, limit, ttl_s)
        now = time.time()
        meta = FilePublic(
            id=file_id, name=name, size=size, sha256=sha256, created_at=now, expires_at=now + ttl_s, tenant=tenant
        )
        key = self.keys.file(meta.id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.hset(key, mapping={"meta": meta.model_dump_json(), "blob": self.blobs.kind})
            pipe.expire(key, ttl_s)
            pipe.execute()
        # (Should that fail, an object elsewhere has no meta: the sweep removes it after its grace.)
        return meta

    def meta(self, file_id: str) -> FilePublic | None:
        with redis_errors():
            raw = self.redis.hget(self.keys.file(file_id), "meta")
        return None if raw is None else FilePublic.model_validate_json(raw)

    def keep(self, file_id: str, until: float) -> None:
        """Make sure a file outlives an execution that refers to it."""
        with redis_errors():
            self.redis.expireat(self.keys.file(file_id), int(until) + 1, gt=True)

    def data(self, file_id: str) -> bytes | None:
        """The file's bytes, checked against its meta's size and sha256; None when the file is gone.

        InputUnavailable when its data is gone or differs, InputStoreUnavailable when its store
        fails or is not one this process uses.
        """
        with redis_errors():
            raw, kind = self.redis.hmget(self.keys.file(file_id), ["meta", "blob"])
        if raw is None:
            return None
        meta = FilePublic.model_validate_json(raw)
        ref = InputFileRef(path=meta.name, file_id=file_id, size=meta.size, sha256=meta.sha256)
        return self._reader(ref, kind).read()

    def open(self, ref: InputFileRef) -> VerifiedInput:
        """A reader of an execution's input file that streams it from its store and checks it has the
        size and sha256 the execution was accepted with (errors as `data`'s, at once or on a read)."""
        with redis_errors():
            kind = self.redis.hget(self.keys.file(ref.file_id), "blob")
        return self._reader(ref, kind)

    def _reader(self, ref: InputFileRef, kind: bytes | str | None) -> VerifiedInput:
        where = REDIS if kind is None else kind.decode() if isinstance(kind, bytes) else kind
        blobs = self._by_kind.get(where)
        if blobs is None:
            raise InputStoreUnavailable(
                ref.path, ref.file_id, f"its data is in the {where} store, which this process is not set to use"
            )
        return VerifiedInput(ref, blobs.read(ref.file_id))

    def sweep(self, now: float | None = None, grace_s: float = ORPHAN_GRACE_S) -> int:
        """Remove stored data whose file is gone (S3; data in Redis goes with its hash). How many."""
        if not isinstance(self.blobs, SweptBlobs):
            return 0
        return self.blobs.sweep((time.time() if now is None else now) - grace_s, self._exist)

    def _exist(self, file_ids: list[str]) -> list[bool]:
        with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            for file_id in file_ids:
                pipe.exists(self.keys.file(file_id))
            return [bool(n) for n in pipe.execute()]


class VerifiedInput:
    """A file-like reader (`read(n)`) over a stored file's chunks that raises InputUnavailable as soon
    as the data turns out shorter or longer than announced or, at its end, hashes differently."""

    def __init__(self, ref: InputFileRef, chunks: Iterator[bytes]) -> None:
        self.ref = ref
        self._chunks = chunks
        self._buffer = b""
        self._at = 0
        self._seen = 0
        self._digest = hashlib.sha256()
        self._ended = False

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._buffer) - self._at < n) and not self._ended:
            self._pull()
        end = len(self._buffer) if n < 0 else min(self._at + n, len(self._buffer))
        # An offset into the buffer, not a slice off its front: a 50 MiB value read from Redis in one
        # chunk is handed out in small reads without being copied at each.
        out, self._at = self._buffer[self._at : end], end
        return out

    def finish(self) -> None:
        """Check what a reader that stopped at the announced size left (an empty file's, say)."""
        while not self._ended:
            self._pull()

    def _pull(self) -> None:
        chunk = self._next()
        if chunk is None:
            self._end()
            return
        self._seen += len(chunk)
        if self._seen > self.ref.size:
            raise self._unavailable(f"it holds more than the {self.ref.size} bytes it was stored with")
        self._digest.update(chunk)
        self._buffer, self._at = self._buffer[self._at :] + chunk, 0  # only what is left unread is kept
        if self._seen == self.ref.size:
            # The announced end, which a tar writer reads up to and no further: the source must end too.
            while (extra := self._next()) == b"":
                pass
            if extra is not None:
                raise self._unavailable(f"it holds more than the {self.ref.size} bytes it was stored with")
            self._end()

    def _next(self) -> bytes | None:
        with _store_errors(self.ref.file_id, "read", self.ref.path):
            return next(self._chunks, None)

    def _end(self) -> None:
        self._ended = True
        if self._seen != self.ref.size:
            raise self._unavailable(f"{self._seen} bytes were stored, not the {self.ref.size} it was accepted with")
        if self._digest.hexdigest() != self.ref.sha256:
            raise self._unavailable("its data does not match the sha256 it was accepted with")

    def _unavailable(self, why: str) -> InputUnavailable:
        return InputUnavailable(self.ref.path, self.ref.file_id, why)


@contextmanager
def _store_errors(file_id: str, action: str, path: str | None = None) -> Iterator[None]:
    """The blob store's errors as the files room's: absent data is InputUnavailable, a failing
    store InputStoreUnavailable (an InfrastructureError: a retry may help)."""
    where = path or file_id
    try:
        yield
    except FileNotFoundError as error:
        raise InputUnavailable(where, file_id, "its data is no longer stored") from error
    except OSError as error:
        raise InputStoreUnavailable(where, file_id, f"the store failed to {action} it: {error}") from error


__all__ = ["ORPHAN_GRACE_S", "FileStore", "InputBlobs", "RedisHashBlobs", "SweptBlobs", "VerifiedInput", "new_file_id"]
