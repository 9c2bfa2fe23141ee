"""Nodes: the hosts workers run on, seen together (workers alive, executions running and finished,
drained or not), and the drain an operator sets so that a node's workers take nothing new.

A worker names its node in its heartbeat (EXECBOX_WORKER__NODE, the host name by default). A drain
is one field of the deployment-wide hash `nodes:drained`; each worker of that node looks at it
before it takes a queue ticket or a session (`DrainWatch`), finishes what it runs, and says
`draining` in its heartbeat. Executions finished per node are a counter each worker keeps in
`nodes:finished` when an execution that ran on a node ends (records expire, so they cannot be
counted later); executions running now are the running set's lease holders, placed by their
heartbeats.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis

from execbox.core.errors import ServiceError
from execbox.core.redis import redis_errors, text
from execbox.fleet.keys import FleetKeys
from execbox.fleet.registry import Heartbeat, WorkerRegistry

log = logging.getLogger(__name__)

NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A node name: a host name's characters (letters, digits, `.`, `_`, `-`), 1 to 128 of them."""
_NODE = re.compile(NODE_PATTERN)


def valid_node(name: str) -> bool:
    return bool(_NODE.fullmatch(name))


def node_problem(name: str) -> str | None:
    """What is wrong with a node name, or None when it is one."""
    if valid_node(name):
        return None
    return (
        f"{name[:40]!r} is not a node name: 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    )


@dataclass(frozen=True)
class NodeView:
    node: str
    """"" for workers of an older version, which do not name their node."""
    workers: tuple[str, ...]
    draining_workers: int
    drained: bool
    drained_at: float | None
    running: int
    finished: int
    last_heartbeat: float | None


class Nodes:
    def __init__(self, client: redis.Redis, keys: FleetKeys) -> None:
        self.redis = client
        self.keys = keys
        self.registry = WorkerRegistry(client, keys)

    def drain(self, node: str) -> float:
        """Mark the node drained (kept if it already was); the time it was first drained."""
        with redis_errors(), self.redis.pipeline() as pipe:
            pipe.hsetnx(self.keys.drained_nodes, node, repr(time.time()))
            pipe.hget(self.keys.drained_nodes, node)
            _, at = pipe.execute()
        return _number(at) or time.time()

    def undrain(self, node: str) -> bool:
        """Let the node's workers take work again; False when it was not drained."""
        with redis_errors():
            return bool(self.redis.hdel(self.keys.drained_nodes, node))

    def drained(self, node: str) -> bool:
        with redis_errors():
            return bool(self.redis.hexists(self.keys.drained_nodes, node))

    def count_finished(self, node: str) -> None:
        with redis_errors():
            self.redis.hincrby(self.keys.finished_by_node, node, 1)

    def overview(self, holders: Mapping[str, str]) -> list[NodeView]:
        """Every node some live worker, drain mark or finished count names, by name.

        `holders`: running execution id -> the worker holding its lease; an execution whose worker
        sent no heartbeat (lost, about to be failed by the reaper) is on no node."""
        beats = self.registry.alive()
        with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.drained_nodes)
            pipe.hgetall(self.keys.finished_by_node)
            drained_raw, finished_raw = pipe.execute()
        drained = {text(k): _number(v) for k, v in drained_raw.items()}
        finished = {text(k): int(_number(v) or 0) for k, v in finished_raw.items()}
        node_of = {beat.name: beat.node for beat in beats}
        running = Counter(node_of[worker] for worker in holders.values() if worker in node_of)
        by_node: dict[str, list[Heartbeat]] = {}
        for beat in beats:
            by_node.setdefault(beat.node, []).append(beat)
        names = set(by_node) | set(drained) | set(finished)
        return [
            NodeView(
                node=name,
                workers=tuple(sorted(beat.name for beat in by_node.get(name, []))),
                draining_workers=sum(1 for beat in by_node.get(name, []) if beat.draining),
                drained=name in drained,
                drained_at=drained.get(name),
                running=running.get(name, 0),
                finished=finished.get(name, 0),
                last_heartbeat=max((beat.at for beat in by_node.get(name, [])), default=None),
            )
            for name in sorted(names)
        ]

    def view(self, node: str, holders: Mapping[str, str]) -> NodeView:
        """One node, also one nothing names yet (drained before its workers start)."""
        for found in self.overview(holders):
            if found.node == node:
                return found
        return NodeView(node, (), 0, False, None, 0, 0, None)


def _number(value: object) -> float | None:
    """A stored number, or None for a missing or damaged one (the view must not fail on one field)."""
    if value is None:
        return None
    try:
        return float(text(value))
    except ValueError:
        return None


class DrainWatch:
    """What one worker knows of its node's drain. `check` asks Redis; a change is logged and told to
    `on_change`. When Redis does not answer, the last known state stands (the worker's own loop
    waits for Redis)."""

    def __init__(self, nodes: Nodes, node: str, on_change: Callable[[bool], None] | None = None) -> None:
        self.nodes = nodes
        self.node = node
        self.draining = False
        self.on_change = on_change
        self._lock = threading.Lock()

    def check(self) -> bool:
        try:
            now = self.nodes.drained(self.node)
        except ServiceError as exc:
            log.warning("could not read whether node %s is drained: %s", self.node, exc.message)
            return self.draining
        with self._lock:
            changed, self.draining = now != self.draining, now
        if changed:
            log.warning(
                "node %s %s", self.node, "drained: finishing what runs, taking nothing new" if now else "undrained"
            )
            if self.on_change is not None:
                self.on_change(now)
        return now


__all__ = ["NODE_PATTERN", "DrainWatch", "NodeView", "Nodes", "node_problem", "valid_node"]
