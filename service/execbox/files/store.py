"""Uploaded and inline input files in Redis (key `file:{id}`, a hash of meta and data)."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time

import redis

from execbox.core.redis import redis_errors
from execbox.files.keys import FileKeys
from execbox.files.schemas import FilePublic


def new_file_id() -> str:
    return "file_" + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


class FileStore:
    def __init__(self, client: redis.Redis, keys: FileKeys) -> None:
        self.redis = client
        self.keys = keys

    def put(self, data: bytes, name: str, ttl_s: int, tenant: str) -> FilePublic:
        now = time.time()
        meta = FilePublic(
            id=new_file_id(),
            name=name,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=now,
            expires_at=now + ttl_s,
            tenant=tenant,
        )
        key = self.keys.file(meta.id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.hset(key, mapping={"meta": meta.model_dump_json(), "data": data})
            pipe.expire(key, ttl_s)
            pipe.execute()
        return meta

    def meta(self, file_id: str) -> FilePublic | None:
        with redis_errors():
            raw = self.redis.hget(self.keys.file(file_id), "meta")
        return None if raw is None else FilePublic.model_validate_json(raw)

    def data(self, file_id: str) -> bytes | None:
        with redis_errors():
            raw = self.redis.hget(self.keys.file(file_id), "data")
        return None if raw is None else raw if isinstance(raw, bytes) else raw.encode()

    def keep(self, file_id: str, until: float) -> None:
        """Make sure a file outlives an execution that refers to it."""
        with redis_errors():
            self.redis.expireat(self.keys.file(file_id), int(until) + 1, gt=True)
