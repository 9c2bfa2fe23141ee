"""JSON request bodies parsed and validated in a worker thread, never on the event loop.

FastAPI parses a JSON body and validates it against the route's model inside the event loop: a
12 MiB plan held every other request (`/healthz` included) for two seconds. Every router of the API
is built with `route_class=OffLoopRoute`, whose handler reads the body (the per-route cap is
api.limits'), then parses and validates it in a thread, at most PARSES at a time
(bounding the memory the parsed objects take), and hands FastAPI the validated model, which it
accepts as it is. Numbers must be finite: `1e400` would be stored as `null` and could not be read
back, so every body is refused with 422 naming the field where one appears.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from anyio import CapacityLimiter, to_thread
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

PARSES = CapacityLimiter(2)
"""Bodies parsed and validated at once (each may take several times its size in memory)."""


class OffLoopRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        field = self.body_field
        if field is None or len(self.dependant.body_params) != 1:
            return handler  # no JSON body to parse (or one FastAPI embeds, which no route declares)

        def parse(raw: bytes) -> Any:
            data = parse_json(raw)
            value, errors = field.validate(data, {}, loc=("body",))
            if errors:
                raise RequestValidationError(errors)
            return value

        async def handle(request: Request) -> Response:
            raw = await request.body()
            if not raw or not _is_json(request):
                return await handler(request)  # FastAPI's own answer (missing body, wrong type)
            value = await to_thread.run_sync(parse, raw, limiter=PARSES)
            return await handler(_Parsed(request, raw, value))

        return handle


def parse_json(raw: bytes | str) -> Any:
    """A JSON body, or RequestValidationError: not JSON (400), or a number that is not finite (422)."""
    try:
        data = json.loads(raw)
        bad = [{"type": "finite_number", "loc": ("body", *path), "msg": "Input should be a finite number (at most "
                "about 1.8e308)", "input": None} for path in _non_finite(data, ())]  # fmt: skip
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the interpreter's limit
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": str(exc)}]) from exc
    if bad:
        raise RequestValidationError(bad[:20])
    return data


def _non_finite(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[str | int, ...]]:
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, (*path, index))


def _is_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return kind == "" or kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class _Parsed(Request):
    """The request with its body already read, and parsed and validated off the loop."""

    def __init__(self, request: Request, raw: bytes, value: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._raw, self._value = raw, value

    async def body(self) -> bytes:
        return self._raw

    async def json(self) -> Any:
        return self._value


__all__ = ["PARSES", "OffLoopRoute", "parse_json"]
