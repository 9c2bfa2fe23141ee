"""What a run cost: the steps it dispatched and the re-plans it took (counted by the executor),
and the model calls the agent reports (POST /v1/runs/{id}/usage), each kept whole (model, role,
tokens in and out, latency, cost) and summed per role, so that a run's cost is complete and its
token and cost budgets can stop it.

A report may carry a `call_id`: the same id reported again (a client retrying) is counted once,
checked against the listed calls and the latest RECENT_IDS ids (so a retry is caught past the list
too). A run keeps at most MAX_ROLES roles, so that what it stores stays bounded.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_LISTED_CALLS = 1000
"""Calls kept one by one in the run (each with a `usage.reported` event); later ones still count in
the sums (`unlisted_calls`)."""
RECENT_IDS = 100
MAX_ROLES = 32
ROLE_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"


class ModelCallReport(BaseModel):
    """One call of the agent's model, as the agent reports it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field("", max_length=200, description="Model name and version.")
    role: str = Field("agent", pattern=ROLE_PATTERN, description="planner, replanner, joiner, supplier, ...")
    input_tokens: int = Field(0, ge=0, le=10**12, description="Input tokens of the call.")
    output_tokens: int = Field(0, ge=0, le=10**12, description="Output tokens of the call.")
    cost_usd: float = Field(0.0, ge=0, le=1e9, description="Cost of the call (finite).")
    latency_ms: float | None = Field(None, ge=0, le=1e9, description="Latency of the call.")
    call_id: str | None = Field(
        None, min_length=1, max_length=200, description="The agent's id for the call: reported twice, counted once."
    )

    @field_validator("role", mode="before")
    @classmethod
    def _word(cls, role: Any) -> Any:
        """`Planner` is `planner`, and an empty role is `agent` (as reports without one always were)."""
        return (role.strip().lower() or "agent") if isinstance(role, str) else role


class ModelCall(ModelCallReport):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    role: str = Field("agent", max_length=64, description="As reported.")  # read back as stored
    at: float = Field(description="Unix time it was reported.")


class RoleUsage(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    calls: int = Field(0, description="Calls reported in this role.")
    input_tokens: int = Field(0, description="Their input tokens.")
    output_tokens: int = Field(0, description="Their output tokens.")
    cost_usd: float = Field(0.0, description="Their cost.")
    latency_ms: float = Field(0.0, description="Their latency, summed (calls that reported one).")


class Usage(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    steps_dispatched: int = Field(0, description="Step attempts dispatched.")
    replans: int = Field(0, description="Revisions accepted.")
    tokens: int = Field(0, description="Model tokens the agent reported (input and output).")
    input_tokens: int = Field(0, description="Input tokens the agent reported.")
    output_tokens: int = Field(0, description="Output tokens the agent reported.")
    cost_usd: float = Field(0.0, description="Model cost the agent reported.")
    model_calls: int = Field(0, description="Model calls the agent reported.")
    latency_ms: float = Field(0.0, description="Their latency, summed.")
    by_role: dict[str, RoleUsage] = Field(default_factory=dict, description="The same, per role.")
    unlisted_calls: int = Field(0, description="Calls counted here but not listed in `model_calls` (past 1000).")


def role_problem(usage: Usage, role: str) -> str | None:
    """Why a call of `role` cannot be counted in this run, if it cannot."""
    if role not in usage.by_role and len(usage.by_role) >= MAX_ROLES:
        return (
            f"the run already counts {MAX_ROLES} roles ({', '.join(sorted(usage.by_role))}); report under one of them"
        )
    return None


def record(usage: Usage, calls: list[ModelCall], recent: list[str], report: ModelCallReport, now: float) -> bool:
    """Add one reported call to the sums and the list (and its call_id to the `recent` ones); False
    when its call_id was counted before."""
    if report.call_id is not None:
        if report.call_id in recent or any(c.call_id == report.call_id for c in calls):
            return False
        recent.append(report.call_id)
        del recent[:-RECENT_IDS]
    tokens = report.input_tokens + report.output_tokens
    latency = report.latency_ms or 0.0
    role = usage.by_role.setdefault(report.role, RoleUsage())
    for total in (usage, role):
        total.input_tokens += report.input_tokens
        total.output_tokens += report.output_tokens
        total.cost_usd += report.cost_usd
        total.latency_ms += latency
    usage.tokens += tokens
    usage.model_calls += 1
    role.calls += 1
    if len(calls) < MAX_LISTED_CALLS:
        calls.append(ModelCall(**report.model_dump(), at=now))
    else:
        usage.unlisted_calls += 1
    return True


def describe(report: ModelCallReport) -> str:
    """The call as one line of the run's events."""
    latency = f", {report.latency_ms:.0f} ms" if report.latency_ms is not None else ""
    return (f"{report.role} ({report.model or 'model unnamed'}): {report.input_tokens} in, {report.output_tokens} out, "
            f"${report.cost_usd:.4f}{latency}")  # fmt: skip


def over_budget(usage: Usage, max_tokens: int | None, max_cost_usd: float | None) -> str | None:
    """`tokens` or `cost` when the reported usage passed that budget."""
    if max_tokens is not None and usage.tokens > max_tokens:
        return "tokens"
    if max_cost_usd is not None and usage.cost_usd > max_cost_usd:
        return "cost"
    return None
