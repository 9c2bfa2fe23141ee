"""Structured JSON logs; every line carries the trace id and execution id in scope."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pythonjsonlogger.json import JsonFormatter

_trace_id: ContextVar[str | None] = ContextVar("trace_id", default=None)
_execution_id: ContextVar[str | None] = ContextVar("execution_id", default=None)


_EXECUTION_ID = re.compile(r"\bexe_[a-z0-9]{26}\b")


class CutConnection(Exception):
    """Raised inside a streamed response body to end the connection on purpose, without the body's
    end (a protocol whose clients read a cut connection as the answer). The server logs it as an
    exception in the application; this module's filter makes that one INFO line, not a traceback."""


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], CutConnection):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = f"connection cut on purpose: {record.exc_info[1]}", ()
            record.exc_info, record.exc_text = None, None
        execution_id = _execution_id.get()
        if execution_id is None:
            # Library lines (RQ announcing a job it dequeued) name the execution in their text.
            found = _EXECUTION_ID.search(record.getMessage())
            execution_id = found.group(0) if found else None
        record.trace_id = _trace_id.get()
        record.execution_id = execution_id
        return True


def configure(level: str, component: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(
        JsonFormatter(
            "{asctime}{levelname}{name}{message}{trace_id}{execution_id}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            static_fields={"component": component},
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def bind(trace_id: str | None, execution_id: str | None) -> None:
    """Bind ids until the enclosing `bound` block ends (inside a job, for the rest of the job)."""
    _trace_id.set(trace_id)
    _execution_id.set(execution_id)


@contextmanager
def bound(trace_id: str | None, execution_id: str | None) -> Iterator[None]:
    """Bind ids to every log line emitted inside the block (this thread/task only)."""
    t1, t2 = _trace_id.set(trace_id), _execution_id.set(execution_id)
    try:
        yield
    finally:
        _trace_id.reset(t1)
        _execution_id.reset(t2)
