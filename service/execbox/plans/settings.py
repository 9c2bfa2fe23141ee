"""The plan room's settings section (`EXECBOX_PLANS__*`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PlanSettings(BaseModel):
    claim_idle_s: float = Field(
        30.0,
        gt=0,
        description="An execution event an API process took for the plan executor and never acknowledged (it "
        "died) is taken over by another after this long.",
    )


__all__ = ["PlanSettings"]
