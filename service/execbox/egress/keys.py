"""The egress room's Redis keys: per-run rules and network slots, refusals, sealed secret headers."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "egress:rule:{address}",
        "string (JSON EgressRule)",
        "the run's timeout + margin",
        ("worker",),
        ("egress",),
        "what the run whose network the proxy has this address on may reach",
    ),
    KeySpec(
        "egress:slot:{subnet}",
        "string (execution id | cooling)",
        "the run, then slot_cooldown_s",
        ("worker",),
        (),
        "a per-run /28, reserved while used and cooling down after",
    ),
    KeySpec(
        "egress:denied:{id}",
        "list of JSON",
        "retention_s",
        ("egress",),
        ("api", "worker"),
        "the proxy's refusals for an execution (first 100)",
        write_only=("egress",),
    ),
    KeySpec(
        "secret:{tenant}:{host}",
        "hash header -> JSON {sealed, tls}",
        "none",
        ("admin",),
        ("egress",),
        "secret headers sealed to the egress proxy's key (tenant `*`: everyone's)",
    ),
)


class EgressKeys(KeyBuilder):
    def egress_rule(self, address: str) -> str:
        return self._k("egress", "rule", address)

    def egress_slot(self, subnet: str) -> str:
        return self._k("egress", "slot", subnet)

    def egress_denied(self, execution_id: str) -> str:
        return self._k("egress", "denied", execution_id)

    def secret(self, tenant: str, host: str) -> str:
        """Outside `t:` on purpose: written by the operator only, and tenant `*` is everyone's."""
        return self._k("secret", f"{tenant}:{host}")


__all__ = ["SCHEMA", "EgressKeys"]
