"""The console (/console): approvals, runs, executions, scripts and the fleet in a browser.

Server-rendered pages over the services the /v1 routes use, signed in with an API key (its
tenant's pages) or the admin token (the operator's). No JavaScript: live pages refresh
themselves, the Content-Security-Policy allows no script at all (execbox.api.console.web).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response

from execbox.api.console import operators, pages
from execbox.api.console.web import HEADERS, PATH, PageError, SignedOut, page, redirect

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


__all__ = ["install"]
