"""The API's HTTP server: uvicorn with a deadline on each request head, a cap on a head's size and
a bound on open connections.

uvicorn closes a keep-alive connection that stays idle, but not one that sends half a head and then
nothing (nor one that connects and sends nothing): such connections stayed open past 90 s, and
nothing bounded how many there were. Here each head must arrive within api.head_timeout_s of its
first byte (of the connection, for the first request; then the connection is closed with a 408),
a head above api.max_head_bytes is a 431, and a request arriving while api.max_connections are open
(or as many requests in progress) is answered at once with a 503 and Retry-After, in problem+json,
instead of queueing behind them, and the rest of a body answered before it was read must arrive
within the head's deadline too (it otherwise had none). The body's own bounds and deadlines are
api.limits'.

A keep-alive connection idle after an answer is another matter: the client may send on it at any
moment, and if the server closes it just then, the request is lost (clients resend no POST). So it
stays open api.keep_alive_s (longer than common clients' pools keep an idle connection), and when
the bound is reached the connections idle the longest are closed to make room before anyone is
refused: idle connections never hold the bound against requests.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from execbox.api.problems import problem_response
from execbox.settings import ApiSettings

RETRY_AFTER_S = 1


def _raw_problem(status: int, reason: str, code: str, detail: str, extra: str = "") -> bytes:
    """A whole problem+json answer, written straight to the socket (no app is running for it)."""
    body = json.dumps({"type": f"https://execbox.dev/problems/{code}", "title": code.replace(".", " "),
                       "status": status, "detail": detail, "code": code, "retryable": False,
                       "errors": []}).encode()  # fmt: skip
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\ncontent-length: {len(body)}"
            f"\r\nconnection: close\r\n{extra}\r\n")  # fmt: skip
    return head.encode() + body


async def _busy(scope: Scope, receive: Receive, send: Send) -> None:
    answer = problem_response(503, "service.busy", "the API is serving as many connections as it takes; retry "
                              "after Retry-After", True, headers={"Retry-After": str(RETRY_AFTER_S),
                                                                  "Connection": "close"})  # fmt: skip
    await answer(scope, receive, send)


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head deadline, the head cap and the connection bound."""

    head_timeout_s = 10.0
    max_head_bytes = 64 * 1024
    max_connections = 1000

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._served = False  # no answer yet on this connection
        self._idle_since: float | None = None  # when the last answer ended, while no next head has begun
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._idle_since = None
        self._head_bytes = 0
        if self._head_timer is None:  # a next request on the connection: its head gets its own deadline
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_bytes = 0  # no head in progress
        if self._over_bound() or len(self.tasks) >= self.max_connections:
            app, self.app = self.app, _busy
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            return
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self._served = True
        # Answered before its body was read (a 401 before a large upload, say): the rest of the body
        # would arrive with no deadline at all (each byte cancels uvicorn's keep-alive timer, and no
        # head is pending), so it gets the head's deadline. Not closed at once: the client may still
        # be sending, and a close then resets the connection before it reads the answer.
        if not self.pipeline and self.cycle is not None and self.cycle.more_body:
            self._disarm()
            self._arm()
        elif not self.pipeline:
            self._idle_since = self.loop.time()
        super().on_response_complete()

    def _over_bound(self) -> bool:
        """Whether this request is beyond the connection bound once idle connections made room for it."""
        if len(self.connections) <= self.max_connections:
            return False
        live = [c for c in self.connections if not c.transport.is_closing()]
        excess = len(live) - self.max_connections
        if excess <= 0:
            return False
        idle = sorted((c for c in live if isinstance(c, BoundedHttp) and c._idle_since is not None),
                      key=lambda c: c._idle_since or 0.0)  # fmt: skip
        for connection in idle[:excess]:
            connection.transport.close()
        return excess > len(idle)

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes <= self.max_head_bytes:
            super().send_400_response(msg)
            return
        self.transport.write(_raw_problem(431, "Request Header Fields Too Large", "request.head_too_large",
                                          f"the request's head exceeds {self.max_head_bytes} bytes; send fewer "
                                          "or shorter headers"))  # fmt: skip
        self.transport.close()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes:
            raise _HeadTooLarge  # httptools ends the parse; uvicorn answers through send_400_response

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return
        if self._served and self._head_bytes == 0:  # the rest of an answered body, or nothing: no answer owed
            self.transport.close()
            return
        late = f"the request's head did not arrive within {self.head_timeout_s:g} s"
        self.transport.write(_raw_problem(408, "Request Timeout", "request.timeout", late))
        self.transport.close()


class _HeadTooLarge(Exception):
    pass


def protocol(settings: ApiSettings) -> type[BoundedHttp]:
    """The protocol class with this deployment's bounds."""
    bounds: dict[str, Any] = {"head_timeout_s": settings.head_timeout_s, "max_head_bytes": settings.max_head_bytes,
                              "max_connections": settings.max_connections}  # fmt: skip
    return type("BoundedHttp", (BoundedHttp,), bounds)


def config(app: ASGIApp, settings: ApiSettings, host: str, port: int) -> uvicorn.Config:
    """uvicorn's configuration of the API: the bounded protocol, no access log (the API logs its own)."""
    return uvicorn.Config(app, host=host, port=port, http=protocol(settings), log_config=None, access_log=False,
                          timeout_keep_alive=settings.keep_alive_s,
                          timeout_graceful_shutdown=settings.shutdown_grace_s)  # fmt: skip


def serve(app: ASGIApp, settings: ApiSettings, host: str, port: int) -> None:
    uvicorn.Server(config(app, settings, host, port)).run()


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port (tests serve on it: `Server.run(sockets=[...])`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    return sock


__all__ = ["BoundedHttp", "bound_socket", "config", "protocol", "serve"]
