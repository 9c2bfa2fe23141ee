"""What the egress path keeps in Redis: per-run rules (by the proxy's address on the run's
network), per-run network slots, refusals, and secret headers sealed to the proxy's key."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import redis

from execbox.core.errors import ServiceError
from execbox.core.redis import redis_errors, text
from execbox.egress.keys import EgressKeys

log = logging.getLogger(__name__)

_COOL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], 'cooling', 'PX', ARGV[2]) end
"""


class EgressStore:
    def __init__(self, client: redis.Redis, keys: EgressKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self._retention_s = retention_s

    def put_rule(self, address: str, rule_json: str, ttl_s: float) -> None:
        with redis_errors():
            self.redis.set(self.keys.egress_rule(address), rule_json, px=int(ttl_s * 1000))

    def rule(self, address: str) -> str | None:
        with redis_errors():
            value = self.redis.get(self.keys.egress_rule(address))
        return None if value is None else text(value)

    def drop_rule(self, address: str) -> None:
        with redis_errors():
            self.redis.delete(self.keys.egress_rule(address))

    def add_denial(self, execution_id: str, entry: dict[str, object], limit: int = 100) -> None:
        """Keep the first `limit` refusals of an execution (a flood of them is not a memory problem)."""
        key = self.keys.egress_denied(execution_id)
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.rpush(key, json.dumps(entry))
            pipe.ltrim(key, 0, limit - 1)
            pipe.expire(key, self._retention_s)
            pipe.execute()

    def denials(self, execution_id: str) -> list[dict[str, object]]:
        with redis_errors():
            return [json.loads(v) for v in self.redis.lrange(self.keys.egress_denied(execution_id), 0, -1)]

    def reserve_slot(self, subnet: str, execution_id: str, ttl_s: float) -> bool:
        """Reserve a per-run network slot; False when another run holds it or it is cooling down."""
        with redis_errors():
            return bool(self.redis.set(self.keys.egress_slot(subnet), execution_id, nx=True, px=int(ttl_s * 1000)))

    def cool_slot(self, subnet: str, execution_id: str, cooldown_s: float) -> None:
        """The run's network is gone: keep the slot unused for cooldown_s more (only if still ours)."""
        with redis_errors():
            self.redis.register_script(_COOL)(
                keys=[self.keys.egress_slot(subnet)], args=[execution_id, max(int(cooldown_s * 1000), 1)]
            )

    # -- secret headers, sealed to the proxy (execbox.egress.sealing); never a plaintext --------

    def set_secret(self, tenant: str, host: str, header: str, sealed: str, tls: bool) -> None:
        with redis_errors():
            self.redis.hset(self.keys.secret(tenant, host), header, json.dumps({"sealed": sealed, "tls": tls}))

    def delete_secret(self, tenant: str, host: str, header: str) -> bool:
        with redis_errors():
            return bool(self.redis.hdel(self.keys.secret(tenant, host), header))

    def secret_names(self) -> list[tuple[str, str, str, bool]]:
        """(tenant, host, header, tls) of every registered secret; never the values."""
        return [(tenant, host, header, tls) for tenant, host, header, _, tls in self.sealed_secrets()]

    def secrets_for(self, tenant: str, host: str) -> list[tuple[str, str, bool]]:
        """(header, sealed value, tls) to add on requests to host: the operator's for everyone, then
        the tenant's."""
        merged: dict[str, tuple[str, str, bool]] = {}
        with redis_errors():
            for owner in ("*", tenant):
                for header, raw in self.redis.hgetall(self.keys.secret(owner, host)).items():
                    data = json.loads(raw)
                    merged[text(header).lower()] = (text(header), str(data["sealed"]), bool(data["tls"]))
        return list(merged.values())

    def sealed_secrets(self) -> list[tuple[str, str, str, str, bool]]:
        """(tenant, host, header, sealed value, tls) of every secret, for re-sealing under a new key."""
        found = []
        prefix = self.keys.secret("", "").removesuffix(":")
        with redis_errors():
            for key in self.redis.scan_iter(match=self.keys.pattern("secret"), count=100):
                tenant, _, host = text(key).removeprefix(prefix).partition(":")
                for header, raw in self.redis.hgetall(key).items():
                    data = json.loads(raw)
                    found.append((tenant, host, text(header), str(data["sealed"]), bool(data["tls"])))
        return sorted(found)


@dataclass
class RunEgress:
    """One run's hold on the egress path (execbox.sandbox.runtime.EgressLease): the /28 it holds
    for the run and its clean-up, then cooling down (see execbox.egress.main), and its rule kept
    under the proxy's address on its network until `drop`."""

    store: EgressStore
    execution_id: str
    rule_json: str
    ttl_s: float
    cooldown_s: float
    addresses: list[str] = field(default_factory=list)

    def reserve(self, subnet: str) -> bool:
        return self.store.reserve_slot(subnet, self.execution_id, self.ttl_s + self.cooldown_s)

    def release(self, subnet: str) -> None:
        self.store.cool_slot(subnet, self.execution_id, self.cooldown_s)

    def register(self, proxy_address: str) -> None:
        self.store.put_rule(proxy_address, self.rule_json, self.ttl_s)
        self.addresses.append(proxy_address)

    def drop(self) -> None:
        """The run is over: its rules go (they would expire anyway, so a failure is only logged)."""
        for address in self.addresses:
            try:
                self.store.drop_rule(address)
            except ServiceError as exc:
                log.warning("clean-up step failed: %s", exc.message)
