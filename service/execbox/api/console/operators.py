"""The console's operator page (a sign-in with the admin token): workers and nodes, the warm pool,
the queue, the background loops' dead letters (inspect, replay, drop) and each tenant's use of
its quotas. The operator sees no tenant's executions or runs here."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response

from execbox.api.bodies import OffLoopRoute
from execbox.api.console.web import PATH, PageError, SignInDep, checked_form, operator_only, page, redirect
from execbox.api.deps import DeadLettersDep, FleetDep, KeysDep, QueueDep, QuotasDep, StoreDep
from execbox.executions.queue import depth
from execbox.fleet.nodes import Nodes

router = APIRouter(prefix=f"{PATH}/operators", include_in_schema=False, route_class=OffLoopRoute)


@router.get("", response_class=HTMLResponse)
def overview(
    request: Request,
    signin: SignInDep,
    fleet: FleetDep,
    store: StoreDep,
    quotas: QuotasDep,
    queue: QueueDep,
    dead_letters: DeadLettersDep,
    keys: KeysDep,
) -> HTMLResponse:
    operator_only(signin)
    workers = sorted(fleet.alive(), key=lambda w: w.name)
    nodes = Nodes(fleet.redis, fleet.keys).overview(store.holders())
    tenants = []
    for tenant in sorted({*quotas.named(), *(k.tenant for k in keys.list())}):
        quota = quotas.quota(tenant)
        running, this_minute = quotas.slots.use(tenant, int(time.time() // 60))
        tenants.append({"tenant": tenant, "running": running, "running_quota": quota.running,
                        "minute": this_minute, "per_minute": quota.per_minute})  # fmt: skip
    return page(request, "operators.html", workers=workers, nodes=nodes, queue_depth=depth(queue),
                letters=dead_letters.list(), tenants=tenants)  # fmt: skip


@router.get("/dead-letters/{loop}/{letter_id}", response_class=HTMLResponse)
def letter(
    request: Request, loop: str, letter_id: str, signin: SignInDep, dead_letters: DeadLettersDep
) -> HTMLResponse:
    operator_only(signin)
    found = dead_letters.get(loop, letter_id)
    if found is None:
        raise PageError(404, "dead_letter.not_found", f"no dead letter {letter_id} of loop {loop}")
    return page(request, "letter.html", letter=found, shown=json.dumps(dataclasses.asdict(found), indent=2))


@router.post("/dead-letters/{loop}/{letter_id}")
def act(
    request: Request,
    loop: str,
    letter_id: str,
    signin: SignInDep,
    dead_letters: DeadLettersDep,
    action: Annotated[str, Form()],
    form_token: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    checked_form(request, signin, form_token)
    operator_only(signin)
    letters = dead_letters
    if action not in ("replay", "drop"):
        raise PageError(422, "console.action", "action must be replay or drop")
    done = letters.replay(loop, letter_id) if action == "replay" else letters.drop(loop, letter_id)
    if not done:
        raise PageError(404, "dead_letter.not_found", f"no dead letter {letter_id} of loop {loop}")
    return redirect(f"{PATH}/operators")


__all__ = ["router"]
