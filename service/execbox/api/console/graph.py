"""A plan's steps laid out as a graph for the console: columns by dependency depth, one box per step.

Pure layout: the template draws the boxes and edges as inline SVG from these numbers, with the
step ids as (escaped) text, so nothing a plan names ever becomes markup or script.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping
from dataclasses import dataclass

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 170, 44, 60, 18, 10


@dataclass(frozen=True)
class Node:
    id: str
    status: str
    x: int
    y: int

    @property
    def label(self) -> str:
        return self.id if len(self.id) <= 22 else self.id[:21] + "…"


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class Graph:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


def layout(depends: Mapping[str, set[str]], statuses: Mapping[str, str]) -> Graph:
    """Steps in plan order (`depends` keeps it), each in the column after its deepest dependency.
    A dependency that names no step of the plan is ignored. Depths are found in a topological
    order, without recursion (a plan may chain a thousand steps); a cycle cannot reach here
    (validation refuses it), and would put every step in the first column."""
    known = {step: {d for d in deps if d in depends and d != step} for step, deps in depends.items()}
    depth: dict[str, int] = dict.fromkeys(depends, 0)
    try:
        for step in graphlib.TopologicalSorter(known).static_order():
            depth[step] = 1 + max((depth[d] for d in known[step]), default=-1)
    except graphlib.CycleError:
        depth = dict.fromkeys(depends, 0)

    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for step in depends:
        column = depth[step]
        row = rows.get(column, 0)
        rows[column] = row + 1
        x, y = MARGIN + column * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y)
        nodes[step] = Node(step, statuses.get(step, "pending"), x, y)
    edges = [
        Edge(nodes[d].x + BOX_W, nodes[d].y + BOX_H // 2, node.x, node.y + BOX_H // 2)
        for step, node in nodes.items()
        for d in sorted(depends[step])
        if d in nodes
    ]
    width = MARGIN * 2 + (max(rows, default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max(rows.values(), default=1) * (BOX_H + GAP_Y) - GAP_Y
    return Graph(list(nodes.values()), edges, width, height)


__all__ = ["BOX_H", "BOX_W", "Edge", "Graph", "Node", "layout"]
