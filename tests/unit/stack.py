"""The in-process stack for orchestration tests: the API app served on a loop of its own, the
worker's real code running executions on the fake sandbox, and the session's real Redis.

No process is spawned and nothing listens on a port. Tests speak to the API through a genuine
`httpx.Client` (its transport hands each request to the app's loop), so a test written against a
running API moves here by changing its fixture. Executions run only when the test says so
(`run_one`, `run_all`: deterministic), or, for the tests that wait on an answer, in a worker thread
woken by each dispatch ticket (`working()`). The API's own background tasks (the plan consumer,
the scheduler, the surprises loop, the waiters' subscription) run on its loop all the time, as
under uvicorn; the worker's other loops (reaper, session host, webhook delivery) are the test's to
start or step.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Awaitable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis
from pydantic import BaseModel

from execbox.api import create_app
from execbox.core.redis import connect
from execbox.sandbox.fake import FakeRuntime
from execbox.sessions.host import SessionHost
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.worker import context
from execbox.worker.context import WorkerContext
from execbox.worker.reaper import report_health
from execbox.worker.tasks import run_next
from tests.conftest import Redis

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
SETTLE_ROUNDS, SETTLE_ROUND_S = 5, 2.0
"""How often, and how long each time, the tasks an app left on its loop are cancelled at its close."""
NOTHING = "nothing to run"
"""What the worker's job function answers when no execution can start."""


class AppLoop:
    """A FastAPI app with its lifespan entered, on an event loop in a thread of its own."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="api-loop", daemon=True)
        self._thread.start()
        self._stop = asyncio.Event()
        ready = threading.Event()

        async def lifespan() -> None:  # entered and left in one task, as a server does (anyio requires it)
            async with app.router.lifespan_context(app):
                ready.set()
                await self._stop.wait()

        self._lifespan = asyncio.run_coroutine_threadsafe(lifespan(), self.loop)
        if not ready.wait(30):
            raise RuntimeError(f"the app's lifespan did not start: {self._lifespan}")
        self.asgi = httpx.ASGITransport(app=app)

    def call(self, awaitable: Awaitable[T], timeout_s: float = 120.0) -> T:
        async def wrapped() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._lifespan.result(30)
        finally:  # the loop ends, settled, whatever the lifespan's exit did
            try:
                asyncio.run_coroutine_threadsafe(self._settle(), self.loop).result(SETTLE_ROUNDS * SETTLE_ROUND_S + 10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(10)
                self.loop.close()

    async def _settle(self) -> None:
        """Every task the app left on its loop cancelled and ended, as asyncio.run does before it
        closes a loop: a task left pending is collected later, in whichever test is then running,
        as an unraisable error. A task that ignores one cancel gets another (the wait channel's
        listener is left behind by design when its clean-up hangs)."""
        for _ in range(SETTLE_ROUNDS):
            left = asyncio.all_tasks() - {asyncio.current_task()}
            if not left:
                break
            for task in left:
                task.cancel()
            await asyncio.wait(left, timeout=SETTLE_ROUND_S)
        await self.loop.shutdown_asyncgens()
        if left := {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}:
            raise RuntimeError(f"tasks the app left did not end when cancelled {SETTLE_ROUNDS} times: {left}")


class LoopTransport(httpx.BaseTransport):
    """A sync transport that runs each request through the app on its loop."""

    def __init__(self, app: AppLoop) -> None:
        self._app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def send() -> tuple[int, httpx.Headers, bytes]:
            inner = httpx.Request(request.method, request.url, headers=request.headers, content=body)
            answer = await self._app.asgi.handle_async_request(inner)
            raw = b"".join([chunk async for chunk in answer.aiter_raw()])
            await answer.aclose()
            return answer.status_code, answer.headers, raw

        status, headers, raw = self._app.call(send())
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(raw), request=request)


class FakeWorker:
    """A worker of the deployment on the fake sandbox, installed as this process's worker (the job
    function RQ would call finds it through `context.current()`)."""

    def __init__(self, settings: Settings, name: str = "w-fake") -> None:
        self.fake = FakeRuntime()
        self.ctx = WorkerContext.build(settings, name, self.fake)
        context.install(self.ctx)

    def run_one(self) -> str:
        """One dispatch ticket, as RQ would call the job function: the id it ran, or NOTHING."""
        return run_next({})

    def run_all(self) -> list[str]:
        """Run executions until none can start; their ids, in order."""
        ran = []
        while (done := self.run_one()) != NOTHING:
            ran.append(done)
        return ran

    @contextmanager
    def hosting_sessions(self) -> Iterator[None]:
        """The worker's session host in a thread, as `execbox worker` runs it (its heartbeat first:
        the fleet's session slots come from it); at the end each held session ends, as at a stop."""
        report_health(self.ctx)
        stop = threading.Event()
        host = SessionHost(self.ctx)
        thread = threading.Thread(target=host.run, args=(stop,), name="session-host", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            host.join(5)

    def close(self) -> None:
        context._current = None  # the next test builds its own
        self.ctx.store.redis.close()


class InStack:
    """One deployment in this process: the API, a worker on the fake sandbox, tenants' keys."""

    def __init__(self, settings: Settings, redis_client: redis.Redis) -> None:
        self.settings = settings
        self.redis = redis_client
        self.keys = ApiKeys(redis_client, settings.redis.key_prefix)
        self.fake_worker = FakeWorker(settings)
        self.app = AppLoop(create_app(settings))
        self._keys: dict[str, str] = {}

    @property
    def fake(self) -> FakeRuntime:
        """The worker's fake sandbox runtime (its scripts, runs and sessions)."""
        return self.fake_worker.fake

    @property
    def worker(self) -> WorkerContext:
        return self.fake_worker.ctx

    # tenants
    def key(self, tenant: str = "alpha") -> str:
        """A real API key of `tenant` (one per tenant and stack)."""
        if tenant not in self._keys:
            self._keys[tenant] = self.keys.create(tenant)[0]
        return self._keys[tenant]

    def headers(self, tenant: str = "alpha") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key(tenant)}"}

    def client(self, tenant: str | None = "alpha", **kwargs: Any) -> httpx.Client:
        """An httpx client of the API as `tenant` (None: no key)."""
        headers = {**(self.headers(tenant) if tenant else {}), **kwargs.pop("headers", {})}
        return httpx.Client(
            transport=LoopTransport(self.app), base_url="http://execbox.test", headers=headers, **kwargs
        )

    # the worker
    def run_one(self) -> str:
        """One dispatch ticket, as RQ would call the job function: the id it ran, or NOTHING."""
        return self.fake_worker.run_one()

    def run_all(self) -> list[str]:
        """Run executions until none can start; their ids, in order."""
        return self.fake_worker.run_all()

    @contextmanager
    def working(self) -> Iterator[None]:
        """A worker thread that runs every execution as its ticket arrives (for requests that wait
        for an execution's end, as `Prefer: wait` and script invocations do)."""
        stop = threading.Event()
        tickets = f"rq:queue:{self.settings.queue.name}"

        def work() -> None:
            while not stop.is_set():
                if self.redis.blpop([tickets], timeout=0.1) is not None:  # a ticket: the API queued one
                    self.run_all()

        thread = threading.Thread(target=work, name="fake-worker", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)

    def hosting_sessions(self) -> AbstractContextManager[None]:
        """The worker's session host in a thread (FakeWorker.hosting_sessions)."""
        return self.fake_worker.hosting_sessions()

    def close(self) -> None:
        try:
            self.app.close()
        finally:
            self.fake_worker.close()


def with_updates(model: M, updates: dict[str, Any]) -> M:
    """`model` with `updates` applied, nested settings by their own fields:
    `with_updates(settings, {"queue": {"max_depth": 1}})` as EXECBOX_QUEUE__MAX_DEPTH=1 would.
    Values are taken as given, not validated: pass each as its field's type (a secret as SecretStr)."""
    changes = {}
    for name, value in updates.items():
        current = getattr(model, name)
        changes[name] = (
            with_updates(current, value) if isinstance(value, dict) and isinstance(current, BaseModel) else value
        )
    return model.model_copy(update=changes)


@contextmanager
def in_stack(redis_server: Redis, tmp_path: Path, **updates: Any) -> Iterator[InStack]:
    """A stack on a key prefix and queue of its own (its keys are removed after), with `updates`
    applied to its settings."""
    prefix = f"u{secrets.token_hex(4)}"
    settings = Settings(
        redis={"url": redis_server.url, "key_prefix": prefix},
        queue={"name": prefix},
        artifacts_dir=tmp_path / "artifacts",
    )
    settings = with_updates(settings, updates)
    client = connect(settings)
    stack = InStack(settings, client)
    try:
        yield stack
    finally:
        stack.close()
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        for key in client.scan_iter(match=f"rq:*{prefix}*", count=1000):
            client.delete(key)
        client.close()
