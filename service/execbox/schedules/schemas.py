"""A schedule on the wire: which script, when (cron in a time zone), and what to do when a firing
overlaps the previous one or falls in a downtime."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from execbox.executions.schemas import InputFile, Labels, StoredWebhook, Webhook

SCHEDULE_ID_PATTERN = r"^sch_[a-z0-9]{26}$"
SCRIPT_REF_PATTERN = r"^[a-z][a-z0-9_.-]{0,99}@(proven|\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?)$"
MAX_MISFIRE_GRACE_S = 86400


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    script: str = Field(
        pattern=SCRIPT_REF_PATTERN, description="`name@version`, or `name@proven` (resolved at each firing)."
    )
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="Inputs of every firing (checked against the script)."
    )
    files: list[InputFile] = Field(
        default_factory=list, description="Input files of every firing (uploaded files by id)."
    )
    cron: str = Field(max_length=200, description="5 fields, or 6 with seconds last; see docs/api.md for DST.")
    timezone: str = Field("UTC", max_length=64, description="IANA time zone the cron is read in.")
    overlap: Literal["skip", "queue_one"] = Field(
        "skip", description="While the previous firing still runs: skip the slot, or keep one to fire when it ends."
    )
    misfire: Literal["skip", "fire_latest"] = Field(
        "skip",
        description="Slots missed by more than misfire_grace_s (a downtime): skip them, or fire the latest once.",
    )
    misfire_grace_s: float = Field(60.0, gt=0, le=MAX_MISFIRE_GRACE_S, description="How late a slot may still fire.")
    labels: Labels = Field(default_factory=dict, max_length=8, description="Labels for its executions.")
    notify: Literal["failures", "all"] = Field(
        "failures",
        description="`all`: a succeeded firing is an event too (script.succeeded, with its outputs and "
        "artifact links), POSTed to the webhook like a failure.",
    )
    webhook: Webhook | None = Field(
        None,
        description="POSTed (signed, retried) when a firing fails (`script.failed`), and with `notify: all` when "
        "one succeeds (`script.succeeded`, with its outputs); otherwise quiet firings send none.",
    )


class ScheduleUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: dict[str, Any] | None = Field(None, description="New inputs for the next firings.")
    files: list[InputFile] | None = Field(None, description="New input files for the next firings.")


class Schedule(ScheduleCreate):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    labels: dict[str, str] = Field(default_factory=dict, description="Labels for its executions (as stored).")
    # Read back as stored: a check added to requests later never makes a stored schedule unreadable.
    webhook: StoredWebhook | None = Field(None, description="Where its events are POSTed (as stored).")  # type: ignore[assignment]
    id: str = Field(description="`sch_` and 26 characters.")
    tenant: str = Field(description="Owner.")
    paused: bool = Field(False, description="A paused schedule fires nothing; slots passed while paused are skipped.")
    created_at: float = Field(description="Unix time.")
    last_slot: float = Field(description="The latest slot handled (fired, queued or skipped).")
    queued_slot: float | None = Field(None, description="A slot kept for when the running firing ends (queue_one).")
    last_execution: str | None = Field(None, description="The execution of the latest firing.")
    queue: str = Field("", description="The queue its firings go to: schedulers of that queue fire it.")


FiringStatus = Literal["fired", "queued", "skipped_overlap", "skipped_misfire", "not_started"]


class Firing(BaseModel):
    slot: float = Field(description="The slot's Unix time.")
    at: float = Field(description="When it was handled.")
    status: FiringStatus = Field(
        description="fired (an execution started), queued (kept behind a running firing), skipped, or not started."
    )
    execution_id: str | None = Field(None, description="Its execution, when it fired.")
    lag_s: float | None = Field(None, description="From the slot to the execution's acceptance.")
    detail: str = Field("", description="Why, for a skip or a refusal.")
