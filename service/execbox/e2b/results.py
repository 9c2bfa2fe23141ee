"""A finished execution in the code interpreter's words: its rich results, error and count as the
NDJSON lines of POST /execute (pure: the bytes of a stored representation come from `read`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

from execbox.e2b.schemas import line
from execbox.executions.schemas import ExecutionError, ResultData, RichResult
from execbox.executions.status import ErrorCategory

FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
"""Media type -> the key of E2B's Result; any other representation goes to `extra` under its media type."""
BINARY = frozenset({"png", "jpeg", "pdf"})
"""Sent as base64, as the code interpreter does."""
RAISED = (ErrorCategory.CODE_EXCEPTION, ErrorCategory.CODE_SYNTAX)
"""Errors the program raised itself: E2B names them by the exception's type."""


def result_line(result: RichResult, read: Callable[[ResultData], bytes]) -> bytes:
    fields: dict[str, Any] = {"is_main_result": result.kind == "execute_result"}
    extra: dict[str, Any] = {}
    for media_type, data in result.data.items():
        key = FORMATS.get(media_type)
        if key in BINARY:
            fields[str(key)] = base64.b64encode(read(data)).decode()
            continue
        text = data.text if data.text is not None else read(data).decode("utf-8", "replace")
        if key == "json":
            fields["json"] = json.loads(text)
        elif key is not None:
            fields[key] = text
        else:
            extra[media_type] = text
    if extra:
        fields["extra"] = extra
    return line("result", **fields)


def error_line(error: ExecutionError) -> bytes:
    """E2B's error has a name, a value and a traceback; a failure that is not the program's own
    (a limit, a lost sandbox) is named by its execbox category, with its message as the value."""
    if error.category in RAISED:
        details = error.details
        return line("error", name=str(details.get("type") or error.category.value),
                    value=str(details.get("message") or error.message),
                    traceback=str(details.get("traceback") or ""))  # fmt: skip
    return line("error", name=error.category.value, value=error.message, traceback="")


def finished_lines(
    results: list[RichResult], error: ExecutionError | None, count: int, read: Callable[[ResultData], bytes]
) -> Iterator[bytes]:
    """What follows the live output: results, the error if any, the count, and the end mark."""
    for result in results:
        yield result_line(result, read)
    if error is not None:
        yield error_line(error)
    yield line("number_of_executions", execution_count=count)
    yield line("end_of_execution")


__all__ = ["FORMATS", "error_line", "finished_lines", "result_line"]
