"""Script versions in Redis: `script:{tenant}:{name}` (hash version -> JSON ScriptVersion),
`scriptuse:{tenant}:{name}` (hash version -> executions started), `scripts:{tenant}` (names)."""

from __future__ import annotations

import redis

from execbox.core.redis import redis_errors, text
from execbox.library.keys import ScriptKeys
from execbox.library.schemas import ScriptVersion


class ScriptStore:
    def __init__(self, client: redis.Redis, keys: ScriptKeys) -> None:
        self.redis = client
        self.keys = keys

    def add(self, version: ScriptVersion) -> ScriptVersion:
        """Store a new version, or return the one already stored under that number."""
        key = self.keys.script(version.tenant, version.name)
        with redis_errors():
            if self.redis.hsetnx(key, version.version, version.model_dump_json()):
                self.redis.sadd(self.keys.scripts(version.tenant), version.name)
                return version
            raw = self.redis.hget(key, version.version)
        return ScriptVersion.model_validate_json(raw)  # type: ignore[arg-type]

    def get(self, tenant: str, name: str, version: str) -> ScriptVersion | None:
        with redis_errors():
            raw = self.redis.hget(self.keys.script(tenant, name), version)
        return None if raw is None else ScriptVersion.model_validate_json(raw)

    def put(self, version: ScriptVersion) -> None:
        with redis_errors():
            self.redis.hset(self.keys.script(version.tenant, version.name), version.version, version.model_dump_json())

    def versions(self, tenant: str, name: str) -> list[ScriptVersion]:
        with redis_errors():
            raws = self.redis.hvals(self.keys.script(tenant, name))
        return [ScriptVersion.model_validate_json(raw) for raw in raws]

    def names(self, tenant: str) -> list[str]:
        with redis_errors():
            return sorted(text(n) for n in self.redis.smembers(self.keys.scripts(tenant)))

    def count_use(self, tenant: str, name: str, version: str) -> None:
        with redis_errors():
            self.redis.hincrby(self.keys.script_use(tenant, name), version, 1)

    def uses(self, tenant: str, name: str) -> dict[str, int]:
        with redis_errors():
            return {text(k): int(v) for k, v in self.redis.hgetall(self.keys.script_use(tenant, name)).items()}
