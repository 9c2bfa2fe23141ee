"""Turning one step attempt (or one of its checks) into an execution, exactly once.

Each dispatch goes through `executions.submit` under the Idempotency-Key `<run>:<step>:<attempt>`
(a check adds its own suffix), so a process that dies after submitting and before saving the run
gets the same execution back when the run is advanced again, never a second one. Artifacts the
arguments refer to are read from the artifact store and travel as input files.

Each execution carries its run and step in its `origin`, which only the service sets; when one
ends, `awaited_by` follows that link only to a run of the same tenant that lists the execution as
an attempt or check of that step, so no other execution can advance a run.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from execbox.catalog.schemas import PolicyRequest
from execbox.core.errors import ServiceError
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, Expect, InputFile, Origin
from execbox.executions.submit import Submissions
from execbox.files.blobs import ArtifactStore
from execbox.library.service import Library, ScriptRun, input_problems
from execbox.plans.refs import artifact_path, refs_in
from execbox.plans.schemas import RUN_ID_PATTERN, CodeCell, Postconditions, ScriptRef, StoredRun
from execbox.plans.step_keys import default_key
from execbox.plans.store import RunStore

log = logging.getLogger(__name__)
_LEGACY_RUN, _LEGACY_STEP = "execbox.run", "execbox.step"
"""The labels that linked a step's execution to its run before `origin` (records stored then)."""

ROUTE = "plan step"
"""The idempotency scope of step dispatches."""


class MissingArtifact(LookupError):
    pass


class StepRefused(Exception):
    """The step cannot start: its error category and message."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category, self.message = category, message


def script_request(
    library: Library, run: StoredRun, step_id: str, ref: ScriptRef, args: dict[str, Any], policy: PolicyRequest
) -> tuple[ExecutionCreate, str]:
    """The execution of a `script:` run (a step's, or its fallback's) and the `name@version` it
    runs: the version it names, or the newest proven one now; its arguments checked against the
    script's input schema; `policy` unless it is the default (then the script's own)."""
    spec = run.spec(step_id)
    name, _, version = ref.script.partition("@")
    try:
        script = library.resolve(run.tenant, name, version)
    except ServiceError as exc:
        raise StepRefused(exc.code, exc.message) from exc
    problems = input_problems(script.input_schema, args, "args")
    if problems:
        raise StepRefused("input.invalid", "; ".join(f"{p.field}: {p.message}" for p in problems))
    chosen = policy if policy != PolicyRequest() else script.default_policy
    try:
        body = library.request(script, args, spec.files).model_copy(update={"policy": chosen})
    except ServiceError as exc:
        raise StepRefused(exc.code, exc.message) from exc
    return body, f"{name}@{script.version}"


def with_postconditions(body: ExecutionCreate, post: Postconditions | None) -> ExecutionCreate:
    """A prepared request (a script's) that must also meet the step's postconditions: both output
    schemas hold (allOf), and the step's exit code when it names one."""
    if post is None or (post.outputs_schema is None and post.exit_code is None):
        return body
    expect = body.expect or Expect()
    schemas = [s for s in (expect.outputs_schema, post.outputs_schema) if s is not None]
    combined = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
    exit_code = post.exit_code if post.exit_code is not None else expect.exit_code
    return body.model_copy(update={"expect": expect.model_copy(update={"outputs_schema": combined,
                                                                       "exit_code": exit_code})})  # fmt: skip


@dataclass(frozen=True)
class Dispatcher:
    submissions: Submissions
    artifacts: ArtifactStore

    def submit(
        self,
        run: StoredRun,
        step_id: str,
        cell: CodeCell | ExecutionCreate,
        raw_args: dict[str, Any],
        args: dict[str, Any],
        attempt: int,
        policy: PolicyRequest,
        files: list[InputFile],
        post: Postconditions | None = None,
        suffix: str = "",
        key: str | None = None,
    ) -> str:
        """The execution id of this attempt (or check): of a code cell, or of a prepared request (a
        script's); raises ServiceError when refused and MissingArtifact when an artifact is gone."""
        extra: list[tuple[str, bytes]] = []
        for ref in refs_in(raw_args):
            if ref.kind == "artifact":
                producer = run.steps[ref.pointer[1]].attempts[-1]
                try:
                    extra.append((artifact_path(ref), b"".join(self.artifacts.read(producer, ref.pointer[3]))))
                except FileNotFoundError as exc:
                    raise MissingArtifact(f"step {ref.pointer[1]} has no artifact {ref.pointer[3]!r}") from exc
        origin = Origin(run=run.id, step=step_id)
        if isinstance(cell, ExecutionCreate):
            body = with_postconditions(cell, post)
            if isinstance(cell, ScriptRun):
                origin = cell.origin.model_copy(update={"run": run.id, "step": step_id})
        else:
            body = ExecutionCreate(
                language=cell.language, code=cell.code, inputs=args, policy=policy, files=files,
                expect=Expect(outputs_schema=post.outputs_schema, exit_code=post.exit_code) if post else None,
            )  # fmt: skip
        # The same key for every attempt (and every step re-adding the same write, when it names a
        # template): what the code forwards to the service it writes to.
        context = {
            "run_id": run.id,
            "step_id": step_id,
            "attempt": str(attempt),
            "idempotency_key": key or default_key(run.id, step_id),
        }
        submitted = self.submissions.submit(
            run.tenant, body, extra, f"00-{run.trace_id}-{secrets.token_hex(8)}-01",
            idempotency_key=f"{run.id}:{step_id}:{attempt}{suffix}", route=ROUTE, context=context, origin=origin,
        )  # fmt: skip
        return submitted.record.id


def awaited_by(store: RunStore, record: ExecutionRecord, queue: str | None = None) -> str | None:
    """The run an ended execution advances: the one its origin names, when that run is the same
    tenant's and lists the execution as an attempt or check of the origin's step; None otherwise.
    The run is read under its lock, so an execution that ended before its dispatch was saved is seen
    listed; raises RunBusy or QueueUnavailable when that cannot be read now. With `queue`, a run of
    another queue's deployment is not followed (and its lock is not taken).

    An execution stored before origins existed names its run in the labels `execbox.run` and
    `execbox.step`; those are followed under the same check (the run must list this very
    execution), so runs in flight across an upgrade go on, and a forged label moves nothing."""
    if record.origin is not None:
        run_id, step = record.origin.run, record.origin.step
    else:
        run_id, step = record.labels.get(_LEGACY_RUN), record.labels.get(_LEGACY_STEP)
    if run_id is None or step is None or not re.match(RUN_ID_PATTERN, run_id):
        return None
    if queue is not None:  # another deployment's run is its own to follow, without taking its lock
        peeked = store.get(run_id)
        if peeked is None or peeked.queue != queue:
            return None
    with store.locked(run_id):
        run = store.get(run_id)
    state = run.steps.get(step) if run is not None and run.tenant == record.tenant else None
    if state is None or record.id not in (*state.attempts, *state.checks):
        if run is not None:
            log.warning("execution %s links run %s step %s, which does not await it; not followed",
                        record.id, run_id, step)  # fmt: skip
        return None
    return run_id
