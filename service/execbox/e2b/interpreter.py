"""The code interpreter's POST /execute and contexts, as calls in the sandbox's session.

A cell is a native execution in the session (same queue, limits, quotas, metrics, run record and
trace id), labelled with the sandbox id. Its stdout and stderr go out as NDJSON lines while it runs
(from the execution's live events); its results, error and count follow when it ends. A client that
goes away before the end (its own timeout, a closed connection) cancels the cell: the kernel is
interrupted and the session lives on, as a notebook's does.

One context per sandbox for now: the session's own interpreter, named after its language. Asking
for another is refused with a clear error rather than answered with a shared one."""

from __future__ import annotations

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
from execbox.e2b.errors import ContextNotFound, NotOffered
from execbox.e2b.results import finished_lines
from execbox.e2b.sandboxes import Opened, sandbox_id
from execbox.e2b.schemas import Context, Execute, NewContext, line, problems
from execbox.executions import live
from execbox.executions.keys import ExecutionKeys
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, ResultData
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import Submissions
from execbox.files.blobs import ArtifactStore
from execbox.files.collect import RICH_DIR
from execbox.sessions.service import Sessions
from execbox.sessions.status import SessionStatus

CWD = "/workspace"
"""Where a cell runs: the sandbox's working directory (execbox.sandbox.runtime.WORKDIR)."""
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

    def contexts(self, opened: Opened) -> list[Context]:
        return [Context(id=opened.session.language, language=opened.session.language, cwd=CWD)]

    def new_context(self, opened: Opened, body: NewContext) -> Context:
        language = opened.session.language
        if body.language not in (None, language) or body.cwd not in (None, CWD):
            raise NotOffered(f"a context other than the sandbox's own ({language!r}, cwd {CWD}) is not offered yet")
        raise NotOffered(f"separate code contexts are not offered yet: run code in the default context {language!r}")

    def context(self, opened: Opened, context_id: str) -> Context:
        found = next((c for c in self.contexts(opened) if c.id == context_id), None)
        if found is None:
            raise ContextNotFound(context_id[:64])
        return found

    def start(self, opened: Opened, body: Execute, traceparent: str | None) -> ExecutionRecord:
        """Submit the cell (in a thread: a few Redis round trips)."""
        session = opened.session
        if body.context_id is not None:
            self.context(opened, body.context_id)
        if body.language not in (None, session.language):
            raise InvalidRequest(
                f"this sandbox runs {session.language}",
                (FieldProblem("language", f"only {session.language!r} here; other languages are not offered yet"),),
            )
        try:
            request = ExecutionCreate(language=session.language, code=body.code, session=session.id,
                                      env=body.env_vars or {}, labels={LABEL: sandbox_id(session.id)})  # fmt: skip
        except ValidationError as exc:
            raise InvalidRequest("this cell cannot run", problems(exc, {"env": "env_vars"})) from exc
        return self.submissions.submit(opened.entry.tenant, request).record

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


__all__ = ["CWD", "LABEL", "Interpreter"]
