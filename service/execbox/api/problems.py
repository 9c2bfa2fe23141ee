"""RFC 9457 problem+json for every error (the request bodies' bounds are api.limits')."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from execbox.core.errors import FieldProblem, ServiceError


class ProblemField(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. `policy.memory_mb` or `query.wait`.")
    message: str = Field(description="What is wrong with it and what to send instead.")


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every 4xx/5xx answer."""

    type: str = Field(description="URI naming the problem type.")
    title: str = Field(description="Short summary of the problem type.")
    status: int = Field(description="HTTP status code.")
    detail: str = Field(description="What went wrong and what to do next.")
    code: str = Field(description="Stable machine-readable code, e.g. `request.policy_exceeded`.")
    retryable: bool = Field(description="True when the same request may succeed later.")
    errors: list[ProblemField] = Field(description="One entry per invalid field (may be empty).")


PROBLEM_TYPE = "https://execbox.dev/problems/"
PROBLEM_DOC: dict[str, object] = {
    "model": Problem,
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}
"""OpenAPI description of a problem+json answer, for routes' `responses`."""
UNAUTHORIZED_DOC: dict[int | str, dict[str, object]] = {
    401: {"description": "Missing, unknown or revoked API key.", **PROBLEM_DOC}
}


def problem_response(
    status: int,
    code: str,
    detail: str,
    retryable: bool,
    problems: tuple[FieldProblem, ...] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + code,
        "title": code.replace(".", " ").replace("_", " "),
        "status": status,
        "detail": detail,
        "code": code,
        "retryable": retryable,
        "errors": [{"field": p.field, "message": p.message} for p in problems],
    }
    return JSONResponse(body, status_code=status, media_type="application/problem+json", headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    # pydantic names the union member it tried (`literal['none']`, `NetworkAllowlist`) and marks a
    # refused mapping key (`[key]`); the client's field path is the same without them.
    parts = [str(p) for p in loc if not (str(p).startswith("literal[") or _MODEL_NAME.match(str(p)) or p == "[key]")]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


_MODEL_NAME = re.compile(r"^[A-Z][A-Za-z0-9]+$")


ForeignShape = Callable[[str, str, int, str, Mapping[str, str]], Response]
"""How a protocol that is not ours answers an error under its path prefix (method, path, status,
message, headers): a client of that protocol parses its own shape, not problem+json."""


def _answer(
    request: Request,
    status: int,
    code: str,
    detail: str,
    retryable: bool,
    problems: tuple[FieldProblem, ...] = (),
    headers: Mapping[str, str] | None = None,
) -> Response:
    shapes: dict[str, ForeignShape] = request.app.state.foreign_shapes
    for prefix, shape in shapes.items():
        if request.url.path.startswith(prefix):
            message = detail + ("".join(f"; {p.field}: {p.message}" for p in problems) if problems else "")
            return shape(request.method, request.url.path, status, message, headers or {})
    return problem_response(status, code, detail, retryable, problems, headers)


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    headers = {"Retry-After": "1"} if exc.http_status == 503 else {}
    return _answer(request, exc.http_status, exc.code, exc.message, exc.retryable, exc.problems,
                   {**headers, **exc.headers})  # fmt: skip


_HTTP_CODES = {400: "request.malformed", 404: "not_found", 405: "method_not_allowed", 413: "request.too_large"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http.error")
    detail = str(exc.detail)
    if exc.status_code == 404:
        detail = f"no such resource: {request.url.path}; see /docs for the API"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return _answer(request, exc.status_code, code, detail, False, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return _answer(
            request,
            400,
            "request.malformed_json",
            "the body is not valid JSON; send a JSON object with Content-Type: application/json",
            False,
            (FieldProblem("body", "invalid JSON"),),
        )
    problems = tuple(FieldProblem(_field(tuple(e["loc"])), str(e["msg"])) for e in errors)
    detail = "; ".join(f"{p.field}: {p.message}" for p in problems)
    return _answer(request, 422, "request.invalid", f"the request is invalid: {detail}", False, problems)


UPLOADS = ("/v1/executions", "/v1/files", "/e2b/sandbox/files")
"""The routes whose bodies carry files (POST): the only ones allowed api.max_body_bytes (api.limits)."""


def install(app: FastAPI, foreign: Mapping[str, ForeignShape] | None = None) -> None:
    """problem+json for every error the routes do not answer themselves, except under the path
    prefixes of `foreign`, which answer in their protocol's own shape."""
    app.state.foreign_shapes = dict(foreign or {})
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
