"""The code interpreter's POST /execute and contexts, as calls in the sandbox's session.

A cell is a native execution in the session (same queue, limits, quotas, metrics, run record and
trace id), labelled with the sandbox id. Its stdout and stderr go out as NDJSON lines while it runs
(from the execution's live events); its results, error and count follow when it ends. A client that
goes away before the end (its own timeout, a closed connection) cancels the cell: the kernel is
interrupted and the session lives on, as a notebook's does.

A cell runs in one of the session's contexts (execbox.e2b.contexts): the default of the language
it names, or the context it names; making, restarting and moving a context to its directory are
cells too, waited for here."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import unquote

import redis.asyncio as aioredis
from anyio import CancelScope, to_thread
from pydantic import ValidationError

from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.core.logs import CutConnection
from execbox.e2b.contexts import HOME, RESET, ContextBook, Target, chdir_code, cwd_of, language_of
from execbox.e2b.errors import ContextCellFailed, SandboxBusy
from execbox.e2b.results import finished_lines
from execbox.e2b.sandboxes import Opened, sandbox_id
from execbox.e2b.schemas import Context, Execute, NewContext, line, problems
from execbox.executions import live
from execbox.executions.keys import ExecutionKeys
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, ResultData
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import Submissions
from execbox.executions.waits import Waiters
from execbox.files.blobs import ArtifactStore
from execbox.files.collect import RICH_DIR
from execbox.sessions.service import Sessions
from execbox.sessions.status import SessionStatus

LABEL = "e2b.sandbox"
"""The label every cell run through the facade carries: its sandbox id."""


@dataclass(frozen=True)
class Interpreter:
    submissions: Submissions
    sessions: Sessions
    artifacts: ArtifactStore
    streams: aioredis.Redis
    keys: ExecutionKeys
    keepalive_ms: int
    waiters: Waiters
    book: ContextBook
    context_cell_s: float
    """How long making, moving or restarting a context waits for its cell (then 500, the cell goes on)."""

    def offered(self, opened: Opened) -> tuple[str, ...]:
        """The context languages of the sandbox's session, its own first."""
        language = self.submissions.languages.get(opened.session.language)
        return (language.base, *(c for c in language.contexts if c != language.base))

    def contexts(self, opened: Opened) -> list[Context]:
        return self.book.all(opened.session.id, self.offered(opened))

    def target(self, opened: Opened, context_id: str) -> Target:
        return self.book.find(opened.session.id, context_id, self.offered(opened))

    async def new_context(self, opened: Opened, body: NewContext) -> Context:
        language = language_of(body.language, self.offered(opened), "language")
        target = await to_thread.run_sync(self.book.add, opened.session.id, language, cwd_of(body.cwd))
        try:
            await self._move(opened, target, "cwd")
        except BaseException:
            await to_thread.run_sync(self.book.forget, opened.session.id, target.context.id)
            raise
        return target.context

    async def restart(self, opened: Opened, context_id: str) -> None:
        target = await to_thread.run_sync(self.target, opened, context_id)
        await self._cell(opened, target, RESET, None)
        await self._move(opened, target, None)

    async def _move(self, opened: Opened, target: Target, field: str | None) -> None:
        """Put a context in its directory (a new one starts in HOME: nothing to do there)."""
        if target.context.cwd != HOME:
            await self._cell(opened, target, chdir_code(target.context.language, target.context.cwd), field)

    async def remove(self, opened: Opened, context_id: str) -> None:
        """Empty a context and forget it if it made it (a default one is emptied and stays)."""
        target = await to_thread.run_sync(self.target, opened, context_id)
        await self._cell(opened, target, RESET, None)
        if target.context.id != target.context.language:
            await to_thread.run_sync(self.book.forget, opened.session.id, target.context.id)

    def start(self, opened: Opened, body: Execute, traceparent: str | None) -> ExecutionRecord:
        """Submit the cell (in a thread: a few Redis round trips)."""
        if body.context_id is not None:
            target = self.target(opened, body.context_id)
            if body.language is not None and language_of(body.language, self.offered(opened), "language") != (
                target.context.language
            ):
                why = f"context {target.context.id} runs {target.context.language}: give one or the other"
                raise InvalidRequest("the language and the context disagree", (FieldProblem("language", why),))
        else:
            language = language_of(body.language, self.offered(opened), "language")
            target = self.target(opened, language)
        return self._submit(opened, target, body.code, body.env_vars or {})

    def _submit(self, opened: Opened, target: Target, code: str, env: dict[str, str]) -> ExecutionRecord:
        session = opened.session
        try:
            request = ExecutionCreate(language=session.language, code=code, session=session.id, env=env,
                                      session_context=target.native,
                                      labels={LABEL: sandbox_id(session.id)})  # fmt: skip
        except ValidationError as exc:
            raise InvalidRequest("this cell cannot run", problems(exc, {"env": "env_vars"})) from exc
        return self.submissions.submit(opened.entry.tenant, request).record

    async def _cell(self, opened: Opened, target: Target, code: str, field: str | None) -> None:
        """Run a cell of the facade's own and wait for it; a failure is the caller's 400 on `field`,
        or a 500."""
        record = await to_thread.run_sync(self._submit, opened, target, code, {})
        final = await self.waiters.wait(record.id, self.context_cell_s, _stays)
        if final is not None and final.status is ExecutionStatus.SUCCEEDED:
            return
        if final is None or not final.status.terminal:
            raise SandboxBusy(f"cell {record.id} for context {target.context.id} is still waiting its turn: try again")
        why = final.error.message if final.error is not None else final.status.value
        if field is not None:
            raise InvalidRequest("the context cannot start there", (FieldProblem(field, why),))
        raise ContextCellFailed(f"context {target.context.id}: cell {record.id} did not succeed: {why}")

    async def lines(self, tenant: str, record: ExecutionRecord) -> AsyncIterator[bytes]:
        """The cell's NDJSON: output as it comes, then what it ended with. Cancelled if the reader
        leaves first."""
        ended = False
        try:
            async for item in live.read(self.streams, self.keys, record.id, "0", self.keepalive_ms):
                if item is None:
                    continue
                _, event, data = item
                if event in live.STREAMS.values():
                    yield line(event, text=json.loads(data)["text"], timestamp=time.time_ns())
                elif event == live.END:
                    break
            finished = await to_thread.run_sync(self._finished, tenant, record)
            ended = True
            if finished is None:  # the SDK then asks /health, hears 502, and says the sandbox was killed
                raise CutConnection(f"sandbox {sandbox_id(record.session or '')} ended under cell {record.id}")
            for piece in finished:
                yield piece
        finally:
            if not ended:
                with CancelScope(shield=True):
                    await to_thread.run_sync(self._cancel, tenant, record.id)

    def _finished(self, tenant: str, record: ExecutionRecord) -> list[bytes] | None:
        """The lines after the output; None when the sandbox ended under the cell (killed, timed
        out, lost), where E2B's own server would have lost the connection with the machine."""
        final = self.submissions.owned(tenant, record.id)
        assert final.session is not None
        session = self.sessions.owned(tenant, final.session)
        if final.status is not ExecutionStatus.SUCCEEDED and session.status is SessionStatus.ENDED:
            return None
        count = session.executions

        def read(data: ResultData) -> bytes:
            name = RICH_DIR + unquote(data.url.rsplit("/results/", 1)[-1])
            return b"".join(self.artifacts.read(record.id, name))

        error = None if final.status is ExecutionStatus.SUCCEEDED else final.error
        return list(finished_lines(final.results, error, count, read))

    def _cancel(self, tenant: str, execution_id: str) -> None:
        try:
            self.submissions.cancel(tenant, execution_id)
        except ServiceError:
            pass  # it ended meanwhile, or Redis is away: the cell's own timeout still ends it


async def _stays() -> None:
    """A caller that never goes away (the facade's own cells are waited for to their end or time)."""
    await asyncio.Event().wait()


__all__ = ["LABEL", "Interpreter"]
