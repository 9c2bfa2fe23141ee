"""The console's pages for a tenant's people: sign-in, approvals, runs, executions, scripts and schedules.

Each page reads through the same services the /v1 routes use, with the signed-in key's tenant and
key id, so what a page shows or changes is exactly what that key may see or change by the API
(`approval.by` included). Pages of a run or execution that has not ended refresh themselves
(a `<meta refresh>`: live without any script).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from execbox.api.bodies import OffLoopRoute
from execbox.api.console import graph
from execbox.api.console.web import (
    COOKIE,
    FILE_HEADERS,
    PATH,
    PageError,
    SignInDep,
    admin_token,
    answer_errors,
    checked_form,
    current,
    page,
    redirect,
    same_origin,
    set_cookie,
    tenant_of,
)
from execbox.api.deps import (
    ArtifactsDep,
    KeysDep,
    LibraryDep,
    RunsDep,
    SchedulerDep,
    SettingsDep,
    SignInsDep,
    StoreDep,
    SubmissionsDep,
    SurprisesDep,
)
from execbox.core.errors import ServiceError
from execbox.executions import live
from execbox.executions.record import ExecutionRecord, RunRecord
from execbox.executions.schemas import EXECUTION_ID_PATTERN
from execbox.executions.submit import Submissions
from execbox.files.blobs import ArtifactStore
from execbox.files.collect import RICH_DIR
from execbox.plans.runs import Runs
from execbox.plans.schemas import ApprovalStatus, Decision, RunStatus
from execbox.plans.validation import dependencies
from execbox.schedules import calendar
from execbox.tenancy.errors import InvalidKey, SignInThrottled

router = APIRouter(prefix=PATH, include_in_schema=False, route_class=OffLoopRoute)
PAGE_BYTES = 64 * 1024
"""stdout and stderr are shown a page of this many characters at a time."""
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Rich results shown as images. SVG is not among them: it is a document that can carry script."""
EXECUTION_ID = re.compile(EXECUTION_ID_PATTERN)


@router.get("", response_class=HTMLResponse)
def home(request: Request, signins: SignInsDep, settings: SettingsDep) -> Response:
    signin = current(request, signins, settings)
    if signin is not None and signin.operator:
        return redirect(f"{PATH}/operators")
    return redirect(f"{PATH}/approvals")


@router.get("/signin", response_class=HTMLResponse)
def signin_form(request: Request) -> HTMLResponse:
    return page(request, "signin.html")


@router.post("/signin", response_class=HTMLResponse)
def signin(
    request: Request, settings: SettingsDep, signins: SignInsDep, key: Annotated[str, Form(max_length=200)] = ""
) -> Response:
    same_origin(request)
    source = request.client.host if request.client is not None else ""
    try:
        cookie, started = signins.start(key.strip(), admin_token(settings), source)
    except InvalidKey:
        return page(request, "signin.html", 401, problem="That key is not a valid API key or admin token.")
    except SignInThrottled as exc:
        refused = page(request, "signin.html", 429, problem=exc.message)
        refused.headers["Retry-After"] = str(exc.retry_after_s)
        return refused
    response = redirect(f"{PATH}/operators" if started.operator else f"{PATH}/approvals")
    set_cookie(request, response, cookie)
    return response


@router.post("/signout")
def signout(request: Request, signin: SignInDep, signins: SignInsDep,
            form_token: Annotated[str, Form(max_length=100)] = "") -> Response:  # fmt: skip
    checked_form(request, signin, form_token)
    signins.end(request.cookies.get(COOKIE))
    response = redirect(f"{PATH}/signin")
    response.delete_cookie(COOKIE, path=PATH)
    return response


# -- approvals ----------------------------------------------------------------------------------


@router.get("/approvals", response_class=HTMLResponse)
def approvals(request: Request, signin: SignInDep, runs: RunsDep) -> HTMLResponse:
    tenant = tenant_of(signin)
    found = runs.approvals(tenant)  # as they stand now: withdrawn once their subject ended
    pending = [a for a in found if a.status is ApprovalStatus.PENDING]
    decided = sorted((a for a in found if a.status is not ApprovalStatus.PENDING),
                     key=lambda a: a.decided_at or a.expires_at, reverse=True)[:50]  # fmt: skip
    plans: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for approval in pending:
        if approval.run_id and approval.run_id not in plans:
            plans[approval.run_id] = _around(runs, tenant, approval.run_id)
    return page(request, "approvals.html", pending=pending, decided=decided, plans=plans,
                pretty=lambda v: json.dumps(v, indent=2, sort_keys=True))  # fmt: skip


def _around(runs: Runs, tenant: str, run_id: str) -> tuple[str, list[tuple[str, str]]]:
    """(the run's status, each step's id and status); ("gone", []) for a run past its retention
    (its approval may outlive it), so that one such approval never stops the page."""
    try:
        run = runs.get(tenant, run_id)
    except ServiceError:
        return "gone", []
    steps = [(s.id, run.steps[s.id].status.value if s.id in run.steps else "pending") for s in run.plan.steps]
    return run.status.value, steps


@router.post("/approvals/{approval_id}/decision")
def decide(
    request: Request,
    approval_id: str,
    signin: SignInDep,
    keys: KeysDep,
    runs: RunsDep,
    decision: Annotated[str, Form()],
    form_token: Annotated[str, Form(max_length=100)] = "",
    reason: Annotated[str, Form(max_length=4000)] = "",
    decided_by: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    checked_form(request, signin, form_token)
    tenant = tenant_of(signin)
    if decision not in ("approve", "reject"):
        raise PageError(422, "console.decision", "decision must be approve or reject")
    body = Decision(decision=decision, reason=reason, decided_by=decided_by)
    gated = keys.requires_approval(signin.key_id)  # a key whose writes need approval decides none
    answer_errors(runs.decide, tenant, approval_id, body, signin.key_id, gated)
    return redirect(f"{PATH}/approvals")


# -- runs ---------------------------------------------------------------------------------------


@router.get("/runs", response_class=HTMLResponse)
def runs(request: Request, signin: SignInDep, runs: RunsDep,
         status: Annotated[str, Query(max_length=40)] = "") -> HTMLResponse:  # fmt: skip
    tenant = tenant_of(signin)
    found = sorted(runs.executor.store.of_tenant(tenant), key=lambda r: r.created_at, reverse=True)
    shown = [r for r in found if not status or r.status.value == status]
    return page(request, "runs.html", runs=shown[:200], status=status, statuses=[s.value for s in RunStatus])


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run(request: Request, run_id: str, signin: SignInDep, runs: RunsDep) -> HTMLResponse:
    tenant = tenant_of(signin)
    stored = answer_errors(runs.get, tenant, run_id)
    statuses = {step_id: state.status.value for step_id, state in stored.steps.items()}
    drawn = graph.layout({s.id: dependencies(s) for s in stored.plan.steps}, statuses)
    handoff = None
    if stored.status in (RunStatus.NEEDS_REPLAN, RunStatus.GOAL_FAILED):  # the only ones that have one
        handoff = answer_errors(runs.handoff, tenant, run_id)
    return page(request, "run.html", run=stored, graph=drawn, box=(graph.BOX_W, graph.BOX_H),
                handoff=handoff.model_dump_json(indent=2) if handoff else None,
                live=not stored.status.terminal)  # fmt: skip


# -- executions ---------------------------------------------------------------------------------


@router.get("/executions", response_class=HTMLResponse)
def find_execution(request: Request, signin: SignInDep, id: Annotated[str, Query(max_length=40)] = "") -> Response:
    tenant_of(signin)
    if id:
        if not EXECUTION_ID.match(id):
            return page(request, "find.html", 422, problem="An execution id is exe_ and 26 letters or digits.")
        return redirect(f"{PATH}/executions/{id}")
    return page(request, "find.html")


def _owned(submissions: Submissions, tenant: str, execution_id: str) -> ExecutionRecord:
    if not EXECUTION_ID.match(execution_id):
        raise PageError(404, "execution.not_found", "no such execution")
    return answer_errors(submissions.owned, tenant, execution_id)


def _pages(text: str) -> int:
    return max(1, -(-len(text) // PAGE_BYTES))


@router.get("/executions/{execution_id}", response_class=HTMLResponse)
def execution(request: Request, execution_id: str, signin: SignInDep, submissions: SubmissionsDep, store: StoreDep,
              out: Annotated[int, Query(ge=1)] = 1, err: Annotated[int, Query(ge=1)] = 1) -> HTMLResponse:  # fmt: skip
    stored = _owned(submissions, tenant_of(signin), execution_id)
    found = stored.public()
    results = [
        {"media_type": media, "url": f"{PATH}/executions/{found.id}/results/{quote(d.url.rsplit('/', 1)[-1])}",
         "text": d.text, "inline": media in INLINE_IMAGES, "sha256": d.sha256, "size": d.size}
        for r in found.results for media, d in r.data.items()
    ]  # fmt: skip
    record = RunRecord.of(stored).model_dump_json(indent=2)
    stdout, stderr = found.stdout, found.stderr
    if found.finished_at is None:  # the record has no output yet: what the run wrote so far
        written = live.so_far(store.redis, store.keys, found.id, PAGE_BYTES * 16)
        stdout, stderr = written["stdout"], written["stderr"]
    return page(request, "execution.html", e=found, results=results, record=record,
                out=stdout[(out - 1) * PAGE_BYTES: out * PAGE_BYTES], out_page=out, out_pages=_pages(stdout),
                err=stderr[(err - 1) * PAGE_BYTES: err * PAGE_BYTES], err_page=err, err_pages=_pages(stderr),
                live=found.finished_at is None)  # fmt: skip


def _download(artifacts: ArtifactStore, execution_id: str, name: str, media_type: str, sha256: str) -> Response:
    try:
        size = artifacts.size(execution_id, name)
    except FileNotFoundError as exc:
        raise PageError(404, "artifact.not_found", "no such file") from exc
    inline = media_type in INLINE_IMAGES
    headers = {**FILE_HEADERS, "Content-Length": str(size), "ETag": f'"{sha256}"',
               "Content-Disposition": ("inline" if inline else "attachment")
               + f"; filename*=UTF-8''{quote(name.rsplit('/', 1)[-1])}"}  # fmt: skip
    shown_as = media_type if inline else "application/octet-stream"
    return StreamingResponse(artifacts.read(execution_id, name), media_type=shown_as, headers=headers)


@router.get("/executions/{execution_id}/artifacts/{name:path}")
def artifact(
    request: Request,
    execution_id: str,
    name: str,
    signin: SignInDep,
    submissions: SubmissionsDep,
    artifacts: ArtifactsDep,
) -> Response:
    found = _owned(submissions, tenant_of(signin), execution_id)
    one = next((a for a in found.artifacts if a.name == name), None)
    if one is None:
        raise PageError(404, "artifact.not_found", "no such artifact")
    return _download(artifacts, found.id, name, "application/octet-stream", one.sha256)


@router.get("/executions/{execution_id}/results/{file}")
def result(
    request: Request,
    execution_id: str,
    file: str,
    signin: SignInDep,
    submissions: SubmissionsDep,
    artifacts: ArtifactsDep,
) -> Response:
    found = _owned(submissions, tenant_of(signin), execution_id)
    suffix = f"/results/{quote(file)}"
    data = next((d for r in found.results for d in r.data.values() if d.url.endswith(suffix)), None)
    if data is None:
        raise PageError(404, "artifact.not_found", "no such result")
    return _download(artifacts, found.id, f"{RICH_DIR}{file}", data.media_type, data.sha256)


# -- scripts and schedules ----------------------------------------------------------------------


@router.get("/scripts", response_class=HTMLResponse)
def scripts(
    request: Request, signin: SignInDep, library: LibraryDep, scheduler: SchedulerDep, events: SurprisesDep
) -> HTMLResponse:
    tenant = tenant_of(signin)
    found = library.search(tenant)
    schedules = []
    for schedule in scheduler.store.of_tenant(tenant):
        upcoming = [] if schedule.paused else list(itertools.islice(
            calendar.slots(schedule.cron, schedule.timezone, max(schedule.last_slot, time.time())), 3))  # fmt: skip
        schedules.append((schedule, upcoming))
    surprises = list(reversed(events.list(tenant)))[:20]
    return page(request, "scripts.html", scripts=found, schedules=schedules, surprises=surprises)


@router.get("/scripts/{name}", response_class=HTMLResponse)
def script(request: Request, name: str, signin: SignInDep, library: LibraryDep) -> HTMLResponse:
    tenant = tenant_of(signin)
    detail = answer_errors(library.detail, tenant, name)
    versions = [(v, answer_errors(library.resolve, tenant, name, v.version)) for v in reversed(detail.versions)]
    return page(request, "script.html", script=detail.name, versions=versions)


__all__ = ["router"]
