"""The plans room's errors: invalid plans, runs and approvals that are not there, busy or not this key's to
decide. Codes are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import ConflictError, FieldProblem, InfrastructureError, NotFound, RequestError


class InvalidPlan(RequestError):
    code = "plan.invalid"

    def __init__(self, problems: tuple[FieldProblem, ...]) -> None:
        super().__init__(f"the plan has {len(problems)} problem(s); each is listed under `errors`", problems)


class RunConflict(ConflictError):
    """What a client asked of a run does not fit where the run is: it ended, it is at another
    revision, the approval was decided, the step has nothing to settle."""

    code = "run.conflict"


class RunNotFound(NotFound):
    code = "run.not_found"
    noun = "run"
    hint = "; it never existed or passed its retention"


class ApprovalNotFound(NotFound):
    code = "approval.not_found"
    noun = "approval"


class ApprovalForbidden(RequestError):
    code = "approval.forbidden"
    http_status = 403

    def __init__(self, approval_id: str, field: str | None = None, why: str | None = None) -> None:
        message = (
            f"approval {approval_id}: {why}"
            if why
            else (f"approval {approval_id} names the API keys that may decide it; this key is not one")
        )
        super().__init__(message, (FieldProblem(field, message),) if field else ())


class InputForbidden(RequestError):
    code = "input.forbidden"
    http_status = 403

    def __init__(self, step_id: str, field: str | None = None) -> None:
        message = f"input step {step_id} names the API keys that may supply it; this key is not one"
        super().__init__(message, (FieldProblem(field, message),) if field else ())


class InvalidInputValue(RequestError):
    code = "input.invalid"

    def __init__(self, step_id: str, problems: tuple[FieldProblem, ...]) -> None:
        super().__init__(f"the value does not satisfy step {step_id}'s schema ({len(problems)} problem(s), listed "
                         "under `errors`); the step still waits: send a corrected value", problems)  # fmt: skip


class RunBusy(InfrastructureError):
    code = "run.busy"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} is being changed by another request; retry shortly")
        self.run_id = run_id


__all__ = [
    "ApprovalForbidden",
    "ApprovalNotFound",
    "InputForbidden",
    "InvalidInputValue",
    "InvalidPlan",
    "RunBusy",
    "RunConflict",
    "RunNotFound",
]
