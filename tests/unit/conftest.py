"""The fast tier: pure logic, plus the stores and the API in-process against the session's real
redis-server (from PATH). Nothing here needs root, Docker or a network beyond loopback.

Each test gets a key prefix (and queue) of its own, through the harness's unrestricted Redis
user, so tests never see each other's keys or the integration stack's.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis
from fastapi import FastAPI
from fastapi import routing as fastapi_routing
from fastapi._compat import v2

from execbox.api import create_app
from execbox.catalog.policies import PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.core import poison
from execbox.core.redis import connect
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import Transition
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import new_execution_id
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests import conftest
from tests.conftest import Redis
from tests.unit.stack import AppLoop, FakeWorker, InStack, in_stack

T = TypeVar("T")


@pytest.fixture(scope="package", autouse=True)
def quick_to_stop() -> Iterator[None]:
    """Consumer loops that take the default block read with a short one: an app's close waits for
    its loops, and a loop sees its stop only when its read returns (0.5 s by default, for each of
    hundreds of apps here). Package scope: a run of both tiers gets the default back for the other."""
    kept, poison.BLOCK_S = poison.BLOCK_S, 0.02
    yield
    poison.BLOCK_S = kept


@pytest.fixture(scope="package", autouse=True)
def quick_clock(redis_server: Redis) -> None:
    """The unit tier's Redis ticks at 100 Hz (10 by default, as the integration tier and a deployment
    keep it): blocked reads time out on the server's tick, up to 100 ms late at 10 Hz, and every
    in-process app's loops end on such a timeout when the app closes (hundreds of apps a run)."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.config_set("hz", 100)
        assert client.config_get("hz") == {"hz": "100"}, client.config_get("hz")


@pytest.fixture(scope="package", autouse=True)
def quick_to_poll() -> Iterator[None]:
    """wait_until polls every 20 ms here: its predicates ask an app in this process, not a server."""
    kept, conftest.POLL_S = conftest.POLL_S, 0.02
    yield
    conftest.POLL_S = kept


@pytest.fixture(scope="package", autouse=True)
def routes_built_once() -> Iterator[None]:
    """FastAPI builds an included router's routes (each one's dependant, validators and handler) at
    the first request an app routes through it: 40-250 ms for each new app's first requests, which
    is once per process in a deployment but once per test here. Apps made alike share them: the
    key is the router and what its inclusion set, except the app itself, which the routes hold only
    to find dependency overrides (an app with overrides, or a router included with dependencies of
    its own, builds its own)."""
    included = fastapi_routing._IncludedRouter
    original = included.effective_candidates
    built: dict[tuple[Any, ...], Any] = {}

    def effective_candidates(self: Any) -> Any:
        context = self.include_context
        provider = context.dependency_overrides_provider
        if getattr(provider, "dependency_overrides", None) or context.dependencies:
            return original(self)
        key = (id(self.original_router), self.original_router._get_routes_version(), context.prefix,
               context.include_in_schema, context.max_body_size)  # fmt: skip
        if key not in built:
            built[key] = original(self)
        return built[key]

    included.effective_candidates = effective_candidates  # type: ignore[method-assign]
    yield
    included.effective_candidates = original  # type: ignore[method-assign]


@pytest.fixture(scope="package", autouse=True)
def routes_typed_once() -> Iterator[None]:
    """FastAPI builds a validator (a pydantic TypeAdapter) for every parameter and answer of every
    route at an app's first request: ~0.2 s of CPU, once per process in a deployment, but once per
    test here, where hundreds of apps are made. Equal field definitions get the validator built for
    the first of them: the key is the field's type, metadata, attributes and config themselves
    (a field whose parts cannot be hashed is built as before), so only identical definitions share."""
    model_field = v2.ModelField
    original = model_field.__post_init__
    built: dict[Any, Any] = {}

    def post_init(field: v2.ModelField) -> None:
        parts = v2.asdict(field.field_info)
        config = None if field.config is None else tuple(sorted(field.config.items()))
        key = (parts["annotation"], tuple(parts["metadata"]), tuple(sorted(parts["attributes"].items())), config)
        try:
            adapter = built.get(key)
        except TypeError:  # unhashable parts (a dict of examples, say)
            original(field)
            return
        if adapter is None:
            original(field)
            built[key] = field._type_adapter
        else:
            field._type_adapter = adapter

    model_field.__post_init__ = post_init  # type: ignore[method-assign,assignment]
    yield
    model_field.__post_init__ = original  # type: ignore[method-assign]


@pytest.fixture
def settings(redis_server: Redis, tmp_path: Path) -> Settings:
    prefix = f"u{secrets.token_hex(4)}"
    return Settings(
        redis={"url": redis_server.url, "key_prefix": prefix},
        queue={"name": prefix},
        artifacts_dir=tmp_path / "artifacts",
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    connection = connect(settings)
    yield connection
    for key in connection.scan_iter(match=f"{settings.redis.key_prefix}:*", count=1000):
        connection.delete(key)
    connection.close()


def make_record(settings: Settings, tenant: str = "alpha", queue_timeout_s: float = 60.0) -> ExecutionRecord:
    """A queued execution as the API would store it (default policy, a one-line program)."""
    policy = PolicySet.load(settings.policies_dir).resolve(PolicyRequest(queue_timeout_s=queue_timeout_s), 9)
    now = time.time()
    return ExecutionRecord(
        id=new_execution_id(),
        tenant=tenant,
        status=ExecutionStatus.QUEUED,
        language="python",
        trace_id=secrets.token_hex(16),
        created_at=now,
        policy=policy,
        code="print(1)\n",
        request_sha256="0" * 64,
        queue_deadline=now + queue_timeout_s,
        transitions=[Transition(status=ExecutionStatus.QUEUED, at=now, by="api")],
    )


class InProcess:
    """Requests straight into the ASGI app (httpx's ASGI transport), with the app's lifespan (the
    waiters' Redis subscription) around them, on the app's loop of its own (tests/unit/stack.py)."""

    def __init__(self, app: FastAPI, address: tuple[str, int] = ("127.0.0.1", 123)) -> None:
        self.app = app
        self._served = AppLoop(app)
        transport = httpx.ASGITransport(app=app, client=address)  # `address`: the client's, as the app sees it
        self.http = httpx.AsyncClient(transport=transport, base_url="http://execbox.test")
        """The async client, for requests a test awaits together (`run` them)."""

    def run(self, awaitable: Awaitable[T], timeout_s: float = 120.0) -> T:
        """`awaitable` run on the app's loop (from any thread), its result."""
        return self._served.call(awaitable, timeout_s)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.run(self.http.get(url, **kwargs))

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.run(self.http.post(url, **kwargs))

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.run(self.http.delete(url, **kwargs))

    def wait_while(self, url: str, headers: dict[str, str], action: Any) -> httpx.Response:
        """GET url while `action` runs in a thread beside it (the request is in flight meanwhile)."""

        async def both() -> httpx.Response:
            answer, _ = await asyncio.gather(self.http.get(url, headers=headers), asyncio.to_thread(action))
            return answer

        return self.run(both())

    def close(self) -> None:
        try:
            self.run(self.http.aclose())
        finally:
            self._served.close()


@pytest.fixture
def api(settings: Settings, client: redis.Redis) -> Iterator[tuple[InProcess, dict[str, dict[str, str]]]]:
    keys = ApiKeys(client, settings.redis.key_prefix)
    headers = {tenant: {"Authorization": f"Bearer {keys.create(tenant)[0]}"} for tenant in ("alpha", "beta")}
    http = InProcess(create_app(settings))
    yield http, headers
    http.close()


@pytest.fixture
def worker(settings: Settings, client: redis.Redis) -> Iterator[FakeWorker]:
    """The deployment's worker on the fake sandbox (beside the `api` fixture's app, on its settings)."""
    made = FakeWorker(settings)
    yield made
    made.close()


@pytest.fixture
def inproc(redis_server: Redis, tmp_path: Path) -> Iterator[InStack]:
    """The in-process stack (tests/unit/stack.py) with the unit settings; for settings of a test's
    own, `with in_stack(redis_server, tmp_path, **updates) as inproc:`."""
    with in_stack(redis_server, tmp_path) as made:
        yield made
