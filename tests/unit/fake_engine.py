"""A fake container engine for unit tests of the reaper and the warm pool (the real one is tested
under tests/integration): it keeps containers in a dict and records what was asked of it; runs and
sessions are the in-memory sandbox's (execbox.sandbox.fake.FakeRuntime)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

from execbox.sandbox.fake import FakeRuntime
from execbox.sandbox.runtime import ContainerInfo, Limits, SandboxSpec


@dataclass
class FakeEngine(FakeRuntime):
    containers: dict[str, ContainerInfo] = field(default_factory=dict)
    networks: dict[str, ContainerInfo] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    resized: list[tuple[str, Limits]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        FakeRuntime.__init__(self)

    def add(
        self, execution_id: str | None = None, age_s: float = 3600.0, pool_memory_mb: int = 0, **labels: str | None
    ) -> str:
        cid = f"c{next(self._ids)}"
        self.containers[cid] = ContainerInfo(
            cid, execution_id, time.time() - age_s, True, **labels, pool_memory_mb=pool_memory_mb
        )
        return cid

    # the Runtime and PoolEngine protocols
    def create_pooled(self, spec: SandboxSpec, pool_class: str) -> str:
        return self.add(age_s=0.0, pool_memory_mb=spec.limits.memory_mb, worker=spec.worker, pool=pool_class)

    def resize(self, container_id: str, held: Limits, wanted: Limits, full_weight: bool = False) -> None:
        self.resized.append((container_id, wanted))

    def remove(self, container_id: str) -> None:
        self.removed.append(container_id)
        self.containers.pop(container_id, None)

    def die(self, container_id: str) -> None:
        self.containers[container_id] = replace(self.containers[container_id], running=False)

    def managed_containers(self, deployment: str) -> list[ContainerInfo]:
        return list(self.containers.values())

    def managed_networks(self, deployment: str) -> list[ContainerInfo]:
        return list(self.networks.values())

    def remove_network(self, network_id: str, proxy_container: str) -> None:
        self.removed.append(network_id)
        self.networks.pop(network_id, None)

    # run, open_session, ping, image_id, runtimes and close: FakeRuntime's
