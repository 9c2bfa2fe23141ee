"""HTTP for plans and runs: validate a plan, run it, follow it, revise it, settle it, approve steps.
Only translation: the work is execbox.plans.runs'."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import IdempotencyDep, RunsDep, SettingsDep, TenantDep, WaitersDep
from execbox.api.params import IdempotencyHeader, PreferHeader, TraceHeader, WaitQuery, disconnected, wait_seconds
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.executions.submit import request_digest
from execbox.plans import compensation
from execbox.plans.errors import InvalidPlan
from execbox.plans.handoff import Handoff
from execbox.plans.schemas import (
    APPROVAL_ID_PATTERN,
    RUN_ID_PATTERN,
    STEP_ID_PATTERN,
    ApprovalPublic,
    ApprovalStatus,
    CancelRequest,
    CompensateRequest,
    Decision,
    InputSupply,
    PlanDocument,
    ReconcileRequest,
    RevisionCreate,
    RunCreate,
    RunPublic,
    RunStatus,
    StoredRun,
)
from execbox.plans.usage import ModelCallReport
from execbox.tenancy.apikeys import DEFAULT_TENANT

router = APIRouter(tags=["plans"], route_class=OffLoopRoute)
RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN, description="Run id (`run_...`).")]
StepId = Annotated[str, Path(pattern=STEP_ID_PATTERN, description="Step id.")]
ApprovalId = Annotated[str, Path(pattern=APPROVAL_ID_PATTERN, description="Approval id (`apr_...`).")]
_P = PROBLEM_DOC
_RUN_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "The body is not JSON.", **_P},
    403: {"description": "This API key may not decide the approval (or supply the input).", **_P},
    404: {"description": "No such run.", **_P},
    413: {"description": "The body is too large.", **_P},
    503: {"description": "Redis unavailable, or another request holds the run; retry.", **_P},
    409: {"description": "The run moved on (revision, status).", **_P},
    422: {"description": "Invalid plan or request: every problem is listed.", **_P},
    **UNAUTHORIZED_DOC,
}
WAITING = (RunStatus.RUNNING,)


class Validation(BaseModel):
    valid: bool = Field(description="True when the plan has no problem (a 422 lists them otherwise).")
    steps: int = Field(description="Steps in the plan.")


@router.post("/v1/plans/validate", response_model=Validation, responses=_RUN_RESPONSES,
             summary="Check a plan without storing or running anything")  # fmt: skip
def validate_plan(plan: PlanDocument, runs: RunsDep, tenant: TenantDep) -> Validation:
    found = runs.validate(tenant, plan)
    if found:
        raise InvalidPlan(tuple(found))
    return Validation(valid=True, steps=len(plan.steps))


@router.post("/v1/runs", status_code=201, response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Run a plan: its ready steps start at once")  # fmt: skip
async def create_run(
    body: RunCreate,
    request: Request,
    response: Response,
    idempotency: IdempotencyDep,
    runs: RunsDep,
    tenant: TenantDep,
    traceparent: TraceHeader = None,
    idempotency_key: IdempotencyHeader = None,
) -> RunPublic:
    def create() -> tuple[StoredRun, bool]:
        return idempotency.once(tenant, "POST /v1/runs", idempotency_key, lambda: request_digest(body),
                                lambda: runs.create(tenant, body, traceparent, _key_gated(request)),
                                lambda run: run.id,
                                lambda run_id: runs.get(tenant, run_id))  # fmt: skip

    run, replayed = await to_thread.run_sync(create)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/runs/{run.id}"
    return run.public()


@router.get("/v1/runs", response_model=list[RunPublic], responses=_RUN_RESPONSES, summary="The tenant's runs")
def list_runs(
    runs: RunsDep,
    tenant: TenantDep,
    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
) -> list[RunPublic]:
    return [r.public() for r in runs.executor.store.of_tenant(tenant) if status in (None, r.status)]


@router.get("/v1/runs/{run_id}", response_model=RunPublic, responses=_RUN_RESPONSES, summary="Get a run")
async def get_run(
    run_id: RunId,
    request: Request,
    settings: SettingsDep,
    runs: RunsDep,
    waiters: WaitersDep,
    tenant: TenantDep,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            description="With `wait`: answer as soon as the run has more than this many `events` "
            "(a step changed) or has ended, whatever it waits for meanwhile (an input, an approval, a re-plan). "
            "Give the count of the events you have seen.",
        ),
    ] = None,
) -> RunPublic:
    """With ?wait=S, answers once the run is no longer `running` nor being compensated (or S passed); with ?after=N
    instead, as soon as it has more than N events or has ended: a live progress display, or an agent waiting
    for an input step's expiry or an approval's decision, waits on it, never a poll."""
    wait_s = wait_seconds(settings, wait, prefer)
    if after is not None and wait_s <= 0:
        message = "after counts events to wait past; it needs a wait (?wait=S or Prefer: wait=S)"
        raise InvalidRequest(f"query.after: {message}", (FieldProblem("query.after", message),))

    def settled(r: StoredRun) -> bool:  # a compensation in progress keeps a stopped run moving
        if after is not None:
            return len(r.events) > after or (r.status.terminal and not compensation.running(r))
        return not (r.status in WAITING or compensation.running(r))

    run = await to_thread.run_sync(runs.get, tenant, run_id)
    if wait_s > 0 and not settled(run):

        async def read() -> StoredRun | None:
            return await to_thread.run_sync(runs.get, tenant, run_id)

        run = await waiters.wait_for(run_id, read, settled, wait_s, disconnected(request)) or run
    return run.public()


@router.get("/v1/runs/{run_id}/handoff", response_model=Handoff, responses=_RUN_RESPONSES,
            summary="What a re-planner needs (only while the run needs a re-plan)")  # fmt: skip
def get_handoff(run_id: RunId, runs: RunsDep, tenant: TenantDep) -> Handoff:
    return runs.handoff(tenant, run_id)


@router.post("/v1/runs/{run_id}/revisions", response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Remove and add steps (against the current revision)")  # fmt: skip
def revise_run(run_id: RunId, body: RevisionCreate, request: Request, runs: RunsDep, tenant: TenantDep) -> RunPublic:
    return runs.revise(tenant, run_id, body, _key_id(request), _key_gated(request)).public()


@router.post("/v1/runs/{run_id}/cancel", response_model=RunPublic, responses=_RUN_RESPONSES, summary="Cancel a run")
def cancel_run(
    run_id: RunId, request: Request, runs: RunsDep, tenant: TenantDep, body: CancelRequest | None = None
) -> RunPublic:
    """With `{"compensate": true}`, its succeeded writes are then undone in reverse order (a gated step's
    compensation only by a key that may decide its approval: 403 otherwise)."""
    return runs.cancel(tenant, run_id, body, _key_id(request), _key_gated(request)).public()


@router.post("/v1/runs/{run_id}/compensate", response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Undo the run's succeeded writes (an unfinished run is abandoned first)")  # fmt: skip
def compensate_run(
    run_id: RunId, body: CompensateRequest, request: Request, runs: RunsDep, tenant: TenantDep
) -> RunPublic:
    """A gated step's compensation runs code its approver may not have decided on: only a key that may
    decide the step's approval asks it (403 `approval.forbidden` otherwise, naming the step)."""
    return runs.compensate(tenant, run_id, body.reason, _key_id(request), _key_gated(request)).public()


@router.post("/v1/runs/{run_id}/steps/{step_id}/reconcile", response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Settle a step whose outcome is unknown (applied or not)")  # fmt: skip
def reconcile_step(
    run_id: RunId, step_id: StepId, body: ReconcileRequest, request: Request, runs: RunsDep, tenant: TenantDep
) -> RunPublic:
    """`not_applied` with `retry`: a gated step waits for a new approval before it runs again."""
    return runs.reconcile(tenant, run_id, step_id, body, _key_gated(request)).public()


@router.post("/v1/runs/{run_id}/usage", response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Report the agent's own model calls, so that the run's cost is complete")  # fmt: skip
def report_usage(run_id: RunId, body: ModelCallReport, runs: RunsDep, tenant: TenantDep) -> RunPublic:
    """Kept whole in `model_calls` and summed per role in `usage`; a `call_id` reported before is
    counted once. Passing `max_tokens` or `max_cost_usd` stops the run (`budget_exceeded:...`)."""
    return runs.report_usage(tenant, run_id, body).public()


@router.post("/v1/runs/{run_id}/steps/{step_id}/input", response_model=RunPublic, responses=_RUN_RESPONSES,
             summary="Supply the value an input step waits for")  # fmt: skip
def supply_input(
    run_id: RunId, step_id: StepId, body: InputSupply, request: Request, runs: RunsDep, tenant: TenantDep
) -> RunPublic:
    """The value must satisfy the step's schema (a 422 names each problem; the run keeps waiting);
    it becomes the step's outputs and the steps after it start. The same value again changes nothing."""
    return runs.supply(tenant, run_id, step_id, body, _key_id(request)).public()


@router.get("/v1/approvals", response_model=list[ApprovalPublic], responses=_RUN_RESPONSES,
            summary="The tenant's approvals")  # fmt: skip
def list_approvals(
    runs: RunsDep,
    tenant: TenantDep,
    status: Annotated[ApprovalStatus | None, Query(description="Only approvals in this status.")] = None,
) -> list[ApprovalPublic]:
    return [a for a in runs.approvals(tenant) if status in (None, a.status)]


@router.get("/v1/approvals/{approval_id}", response_model=ApprovalPublic, responses=_RUN_RESPONSES,
            summary="Get an approval")  # fmt: skip
def get_approval(approval_id: ApprovalId, runs: RunsDep, tenant: TenantDep) -> ApprovalPublic:
    return runs.approval(tenant, approval_id)


@router.post("/v1/approvals/{approval_id}/decision", response_model=ApprovalPublic, responses=_RUN_RESPONSES,
             summary="Approve or reject a step")  # fmt: skip
def decide(
    approval_id: ApprovalId, body: Decision, request: Request, runs: RunsDep, tenant: TenantDep
) -> ApprovalPublic:
    """409 when it was decided otherwise, or its run or execution ended (withdrawn) or it expired;
    403 for a key it does not name, or a key whose own writes need approval."""
    return runs.decide(tenant, approval_id, body, _key_id(request), _key_gated(request))


def _key_id(request: Request) -> str:
    """The API key of the request (auth off: everyone is `default`)."""
    return str(getattr(request.state, "api_key_id", DEFAULT_TENANT))


def _key_gated(request: Request) -> bool:
    """Whether the request's API key has its writes wait for approval (the operator's policy)."""
    return bool(getattr(request.state, "api_key_gated", False))
