"""The fleet room's wire models: a node as the admin API shows it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from execbox.fleet.nodes import NodeView


class NodePublic(BaseModel):
    node: str = Field(description='Node name (EXECBOX_WORKER__NODE); "" for workers too old to name theirs.')
    workers: list[str] = Field(description="Names of the node's live workers (those whose heartbeat has not expired).")
    draining_workers: int = Field(description="Live workers that have seen the drain (they take nothing new).")
    drained: bool = Field(
        description="An operator drained the node: its workers finish what they run, take nothing new."
    )
    drained_at: float | None = Field(None, description="Unix time the node was drained; null when it is not.")
    running: int = Field(description="Executions running on the node now (one-shot runs and session calls).")
    finished: int = Field(
        description="Executions that ended after running on the node, counted by the workers as each ends "
        "(a counter kept for the deployment's life; records themselves expire)."
    )
    last_heartbeat: float | None = Field(None, description="Unix time of the latest heartbeat of its workers.")

    @classmethod
    def of(cls, view: NodeView) -> NodePublic:
        return cls(
            node=view.node,
            workers=list(view.workers),
            draining_workers=view.draining_workers,
            drained=view.drained,
            drained_at=view.drained_at,
            running=view.running,
            finished=view.finished,
            last_heartbeat=view.last_heartbeat,
        )


__all__ = ["NodePublic"]
