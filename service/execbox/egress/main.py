"""`execbox egress`: the egress proxy process, with its rules, secrets and refusals in Redis."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time

from execbox.core import logs
from execbox.core.redis import connect
from execbox.egress.keys import EgressKeys
from execbox.egress.proxy import Denied, EgressProxy, SecretHeader
from execbox.egress.rules import EgressRule
from execbox.egress.sealing import Opener, SealingError
from execbox.egress.settings import EgressConfig
from execbox.egress.store import EgressStore

log = logging.getLogger(__name__)


class RedisRules:
    """The proxy's RuleSource over the egress keys in Redis.

    Nothing is cached: a rule is read for every connection, so a connection is always judged by
    the rule of the run that holds the network now (a slot's previous run can never lend it its
    allowlist or its tenant's secrets). Secret values arrive sealed and are opened here only.
    """

    def __init__(self, store: EgressStore, opener: Opener | None) -> None:
        self._store = store
        self._opener = opener

    def rule(self, local_address: str) -> EgressRule | None:
        raw = self._store.rule(local_address)
        return None if raw is None else EgressRule.from_json(raw)

    def secrets(self, tenant: str, host: str) -> list[SecretHeader]:
        found = self._store.secrets_for(tenant, host)
        if found and self._opener is None:
            raise Denied(f"{host} needs a secret header but this proxy has no private key "
                         "(EXECBOX_EGRESS__PRIVATE_KEY_FILE)", 502)  # fmt: skip
        try:
            return [SecretHeader(name, self._opener.open(sealed), tls) for name, sealed, tls in found if self._opener]
        except SealingError as exc:
            log.error("secret for %s cannot be opened: %s", host, exc)
            raise Denied(
                f"a secret header for {host} cannot be opened by this proxy; the operator must re-seal it", 502
            ) from exc

    def denied(self, rule: EgressRule, host: str, port: int, reason: str) -> None:
        with logs.bound(rule.trace_id, rule.execution_id):
            log.info("egress refused", extra={"host": host, "port": port, "reason": reason})
            self._store.add_denial(
                rule.execution_id,
                {"host": host, "port": port, "at": time.time(), "reason": reason, "trace_id": rule.trace_id},
            )


def run_egress(settings: EgressConfig, host: str = "0.0.0.0") -> None:
    logs.configure(settings.log_level, "egress")
    store = EgressStore(connect(settings), EgressKeys(settings.redis.key_prefix), settings.retention_s)
    egress = settings.egress
    opener = Opener(egress.private_key_file) if egress.private_key_file else None
    proxy = EgressProxy(
        RedisRules(store, opener),
        private_ok=[ipaddress.ip_network(c, strict=False) for c in egress.allow_private_cidrs],
        never=[ipaddress.ip_network(egress.subnet_pool, strict=False)],
    )

    async def serve() -> None:
        server = await proxy.serve(host, egress.port)
        log.info("egress proxy listening on %s:%d", host, egress.port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())
