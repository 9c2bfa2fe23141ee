"""The console's mechanisms: who is signed in, the form token and origin checks, the pages' headers.

Everything the console shows came from model-written code or its output, so it is hostile:
templates escape every value (Jinja2's autoescape), and every answer carries a
Content-Security-Policy with no script at all, no inline style, no frames, and forms that post
only to the console. A state-changing request must come from the console's own origin (its
`Origin`, or `Referer` when a browser sends no Origin) and, once signed in, echo the sign-in's
form token; the cookie is `HttpOnly`, `SameSite=Strict`, `Secure` behind TLS, and scoped to
/console.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape

from execbox.api.deps import SettingsDep, SignInsDep
from execbox.core.errors import ServiceError
from execbox.settings import Settings
from execbox.tenancy.signins import SIGNIN_TTL_S, SignIn, SignIns

T = TypeVar("T")
COOKIE = "execbox_console"
PATH = "/console"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
FILE_HEADERS = {**HEADERS, "Content-Security-Policy": "default-src 'none'; sandbox"}
"""A file the console hands over is never a document of its origin, even when opened directly."""


def _when(at: float | None) -> str:
    return "" if not at else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _in(at: float | None) -> str:
    if not at:
        return ""
    left = at - time.time()
    return f"in {int(left)} s" if left >= 0 else f"{int(-left)} s ago"


_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
_env.filters["when"] = _when
_env.filters["from_now"] = _in
templates = Jinja2Templates(env=_env)


def admin_token(settings: Settings) -> str | None:
    token = settings.auth.admin_token
    return token.get_secret_value() if token is not None else None


def same_origin(request: Request) -> None:
    """A form post from anywhere but the console's own pages is refused (403)."""
    sent = request.headers.get("origin") or request.headers.get("referer") or ""
    origin = urlsplit(sent)
    if not sent or origin.netloc != request.headers.get("host", "") or origin.scheme != request.url.scheme:
        raise PageError(403, "console.origin", "this form must be sent from the console's own pages")


class SignedOut(Exception):
    """No valid sign-in: a page sends the browser to the sign-in form."""


def current(request: Request, signins: SignIns, settings: Settings) -> SignIn | None:
    """The request's sign-in, or None."""
    return signins.read(request.cookies.get(COOKIE), admin_token(settings))


def _signed_in(request: Request, signins: SignInsDep, settings: SettingsDep) -> SignIn:
    found = current(request, signins, settings)
    if found is None:
        raise SignedOut()
    request.state.signin = found
    return found


SignInDep = Annotated[SignIn, Depends(_signed_in)]


def checked_form(request: Request, signin: SignIn, form_token: str) -> None:
    same_origin(request)
    if not secrets.compare_digest(form_token.encode(), signin.form_token.encode()):
        raise PageError(403, "console.form_token", "the form's token does not match this sign-in; reload the page")


def tenant_of(signin: SignIn) -> str:
    if signin.operator:
        raise PageError(403, "console.no_tenant", "the operator's sign-in has no tenant: sign in with an API key")
    return signin.tenant


def operator_only(signin: SignIn) -> None:
    if not signin.operator:
        raise PageError(403, "console.operators_only", "operators only: sign in with the admin token")


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    signin: SignIn | None = getattr(request.state, "signin", None)
    response = templates.TemplateResponse(
        request, name, {"signin": signin, "now": time.time(), **context}, status_code=status_code
    )
    response.headers.update(HEADERS)
    return response


def set_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(COOKIE, token, max_age=SIGNIN_TTL_S, path=PATH, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")  # fmt: skip


def redirect(to: str) -> RedirectResponse:
    response = RedirectResponse(to, status_code=303)
    response.headers.update(HEADERS)
    return response


def answer_errors(call: Callable[..., T], *args: Any) -> T:
    """call(*args), with a service error turned into a page naming it, with its status (404, 409, 403 ...)."""
    try:
        return call(*args)
    except ServiceError as exc:
        raise PageError(exc.http_status, exc.code, str(exc)) from exc


class PageError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


__all__ = ["COOKIE", "CSP", "FILE_HEADERS", "HEADERS", "PageError", "SignInDep", "SignedOut", "page"]
