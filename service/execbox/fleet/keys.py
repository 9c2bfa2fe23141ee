"""The fleet room's Redis keys: worker heartbeats, and the nodes an operator drained."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "worker:{name}",
        "string (JSON heartbeat)",
        "3 heartbeats",
        ("worker",),
        ("api", "admin"),
        "a live worker: its node, engine health, missing images, runtimes, whether it is draining",
    ),
    KeySpec(
        "nodes:drained",
        "hash node -> unix time drained",
        "none",
        ("api", "admin"),
        ("worker",),
        "nodes whose workers take nothing new (deployment-wide, not per tenant)",
    ),
    KeySpec(
        "nodes:finished",
        "hash node -> count",
        "none",
        ("worker",),
        ("api", "admin"),
        "executions that reached a terminal status after running on each node",
    ),
)


class FleetKeys(KeyBuilder):
    def worker(self, name: str) -> str:
        return self._k("worker", name)

    @property
    def drained_nodes(self) -> str:
        return self._k("nodes", "drained")

    @property
    def finished_by_node(self) -> str:
        return self._k("nodes", "finished")


__all__ = ["SCHEMA", "FleetKeys"]
