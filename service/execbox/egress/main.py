"""`execbox egress`: the egress proxy process, with its rules, secrets and refusals in Redis."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time

from execbox import logs
from execbox import store as store_mod
from execbox.egress.proxy import EgressProxy, SecretHeader
from execbox.egress.rules import EgressRule
from execbox.settings import Settings

log = logging.getLogger(__name__)
RULE_CACHE_S = 2.0


class RedisRules:
    """The proxy's RuleSource over the execution store; a found rule is cached briefly (never a miss)."""

    def __init__(self, store: store_mod.ExecutionStore) -> None:
        self._store = store
        self._cache: dict[str, tuple[float, EgressRule]] = {}

    def rule(self, local_address: str) -> EgressRule | None:
        cached = self._cache.get(local_address)
        if cached is not None and time.monotonic() - cached[0] < RULE_CACHE_S:
            return cached[1]
        raw = self._store.egress_rule(local_address)
        if raw is None:
            self._cache.pop(local_address, None)
            return None
        rule = EgressRule.from_json(raw)
        self._cache[local_address] = (time.monotonic(), rule)
        return rule

    def secrets(self, tenant: str, host: str) -> list[SecretHeader]:
        return [SecretHeader(name, value, tls) for name, value, tls in self._store.secrets_for(tenant, host)]

    def denied(self, rule: EgressRule, host: str, port: int, reason: str) -> None:
        with logs.bound(rule.trace_id, rule.execution_id):
            log.info("egress refused", extra={"host": host, "port": port, "reason": reason})
            self._store.add_denial(
                rule.execution_id,
                {"host": host, "port": port, "at": time.time(), "reason": reason, "trace_id": rule.trace_id},
            )


def run_egress(settings: Settings, host: str = "0.0.0.0") -> None:
    logs.configure(settings.log_level, "egress")
    store = store_mod.ExecutionStore(store_mod.connect(settings), settings)
    egress = settings.egress
    proxy = EgressProxy(
        RedisRules(store),
        private_ok=[ipaddress.ip_network(c, strict=False) for c in egress.allow_private_cidrs],
        never=[ipaddress.ip_network(egress.subnet_pool, strict=False)],
    )

    async def serve() -> None:
        server = await proxy.serve(host, egress.port)
        log.info("egress proxy listening on %s:%d", host, egress.port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())
