"""The Python client has a method for every public route of the API (admin routes are the
operator's CLI's): compared against the app's own OpenAPI paths, so a new route without a client
method fails here."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from execbox_client.client import AsyncClient, Call, Client, Endpoints

from execbox.api import create_app
from execbox.settings import Settings

pytestmark = pytest.mark.redis
CONVENIENCE = {"download"}
"""Methods that reach a route another method already names (by an artifact's URL)."""
STREAMED = {("GET", "/v1/executions/{execution_id}/events")}
"""Read as a stream by each client's own `events` (not a request/answer call)."""


class Recorder(Endpoints):
    def __init__(self) -> None:
        self.calls: set[tuple[str, str]] = set()

    def _send(self, call: Call[Any]) -> Any:
        self.calls.add((call.method, call.path))


def placeholders(method: Any) -> list[Any]:
    """Each required argument as its own name in braces (a path template), or {} for a body."""
    needed = [
        p
        for p in inspect.signature(method).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]
    return [f"{{{p.name}}}" if p.annotation == "str" else {} for p in needed]  # fmt: skip


def test_the_client_calls_every_public_route(settings: Settings) -> None:
    paths = create_app(settings).openapi()["paths"]
    routes = {(method.upper(), path) for path, operations in paths.items() for method in operations
              if not path.startswith("/v1/admin") and path != "/metrics"}  # fmt: skip
    recorder = Recorder()
    for name, method in inspect.getmembers(Endpoints, inspect.isfunction):
        if not name.startswith("_") and name not in CONVENIENCE:
            method(recorder, *placeholders(method))
    assert inspect.isgeneratorfunction(Client.events) and inspect.isasyncgenfunction(AsyncClient.events)
    recorder.calls |= STREAMED
    assert recorder.calls == routes, {"no client method": routes - recorder.calls, "no route": recorder.calls - routes}


def test_every_category_the_cli_maps_to_an_exit_code_is_one_the_service_reports() -> None:
    # A key the service never sends (it once said limit.cpu_time and limit.network) makes `ebx run`
    # exit 1 for that outcome instead of its documented code.
    from execbox_client.cli import EXIT_CODES

    from execbox.executions.status import ErrorCategory, ExecutionStatus

    known = {c.value for c in ErrorCategory} | {s.value for s in ExecutionStatus}
    assert set(EXIT_CODES) - known == set()
    limits = {c.value for c in ErrorCategory if c.value.startswith(("limit.", "policy."))}
    assert limits - set(EXIT_CODES) == set(), "every limit and policy outcome has its own exit code"
