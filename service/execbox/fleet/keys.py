"""The fleet room's Redis keys: worker heartbeats."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "worker:{name}",
        "string (JSON heartbeat)",
        "3 heartbeats",
        ("worker",),
        ("api",),
        "a live worker: engine health, missing images, runtimes",
    ),
)


class FleetKeys(KeyBuilder):
    def worker(self, name: str) -> str:
        return self._k("worker", name)


__all__ = ["SCHEMA", "FleetKeys"]
