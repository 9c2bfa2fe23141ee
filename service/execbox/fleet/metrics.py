"""The fleet room's metrics, recorded by each worker: its node, whether it is draining, and executions
finished per node. The `node` label takes node names only (EXECBOX_WORKER__NODE), a few per deployment."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class NodeMetrics:
    info: Gauge
    draining: Gauge
    executions: Counter

    def initialise(self, node: str, statuses: Iterable[str]) -> None:
        """The worker's own node at 1 and its finished counts at zero, so a chart has a series from the start."""
        self.info.labels(node).set(1)
        self.draining.set(0)
        for status in statuses:
            self.executions.labels(node, status)


def node_metrics(registry: CollectorRegistry) -> NodeMetrics:
    return NodeMetrics(
        info=Gauge("execbox_worker_node_info", "Always 1, labelled with the node this worker runs on (join other "
                   "worker metrics on `instance` to chart them per node)", ["node"], registry=registry),
        draining=Gauge("execbox_worker_draining", "1 while this worker's node is drained (it takes nothing new)",
                       registry=registry),
        executions=Counter("execbox_node_executions_total", "Executions that ended after running on a node, by the "
                           "node they ran on and their terminal status (counted by the worker that stored the end)",
                           ["node", "status"], registry=registry),
    )  # fmt: skip


__all__ = ["NodeMetrics", "node_metrics"]
