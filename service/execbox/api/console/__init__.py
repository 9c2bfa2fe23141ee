"""The console (/console): approvals, runs, executions, scripts and the fleet in a browser.

Server-rendered pages over the services the /v1 routes use, signed in with an API key (its
tenant's pages) or the admin token (the operator's). No JavaScript: live pages refresh
themselves, the Content-Security-Policy allows no script at all (execbox.api.console.web).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from inspect import iscoroutinefunction
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from execbox.api.console import operators, pages
from execbox.api.console.web import HEADERS, PATH, PageError, SignedOut, page, redirect
from execbox.core.errors import ServiceError

STATIC = Path(__file__).with_name("static")


def install(app: FastAPI) -> None:
    app.include_router(pages.router)
    app.include_router(operators.router)

    @app.get(f"{PATH}/static/console.css", include_in_schema=False)
    def stylesheet() -> Response:
        return FileResponse(STATIC / "console.css", media_type="text/css",
                            headers={**HEADERS, "Cache-Control": "max-age=300"})  # fmt: skip

    @app.exception_handler(SignedOut)
    async def signed_out(request: Request, exc: SignedOut) -> Response:
        return redirect(f"{PATH}/signin")

    @app.exception_handler(PageError)
    async def page_error(request: Request, exc: PageError) -> Response:
        return page(request, "error.html", exc.status, error=exc)

    for kind in (ServiceError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, _as_page(app.exception_handlers.get(kind)))


def _as_page(api_handler: Callable[[Request, Any], Any] | None) -> Callable[[Request, Any], Awaitable[Response]]:
    """Under /console, an error the API answers as a problem document (a bad query parameter,
    Redis unavailable, an unknown path) is a page with the console's headers instead."""

    async def handle(request: Request, exc: Exception) -> Response:
        if request.url.path == PATH or request.url.path.startswith(f"{PATH}/") or api_handler is None:
            status = getattr(exc, "http_status", None) or getattr(exc, "status_code", None) or 422
            code = getattr(exc, "code", None) or ("request.invalid" if status == 422 else "console.error")
            message = (
                str(getattr(exc, "detail", None) or exc) if status != 422 else "a parameter of this page is invalid"
            )
            return page(request, "error.html", int(status), error=PageError(int(status), code, message))
        answer: Response = (
            await api_handler(request, exc) if iscoroutinefunction(api_handler) else api_handler(request, exc)
        )
        return answer

    return handle


__all__ = ["install"]
