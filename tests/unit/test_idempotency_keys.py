"""Idempotency-Key claims against a real Redis: one creation per key, replays, mismatches, failures."""

from __future__ import annotations

import threading

import pytest
import redis

from execbox.core.errors import RequestError
from execbox.executions.errors import IdempotencyMismatch
from execbox.executions.idempotency import IdempotencyKeys, KeyResult
from execbox.keyschema import Keys
from execbox.settings import Settings
from tests.conftest import wait_until

pytestmark = pytest.mark.redis
ROUTE = "POST /v1/executions"


def test_the_first_request_creates_and_a_retry_replays(settings: Settings, client: redis.Redis) -> None:
    keys = IdempotencyKeys(client, settings.redis.key_prefix, 3600)
    created: list[str] = []

    def create() -> str:
        created.append(f"exe_{len(created)}")
        return created[-1]

    first = keys.run("alpha", ROUTE, "key-1", "hash-a", create)
    again = keys.run("alpha", ROUTE, "key-1", "hash-a", create)
    other_tenant = keys.run("beta", ROUTE, "key-1", "hash-a", create)

    assert (first.resource_id, first.replayed) == ("exe_0", False)
    assert (again.resource_id, again.replayed) == ("exe_0", True)
    assert (other_tenant.resource_id, other_tenant.replayed) == ("exe_1", False), "keys are per tenant"
    assert created == ["exe_0", "exe_1"]


def test_once_creates_without_a_key_and_answers_a_retry_with_what_the_first_created(
    settings: Settings, client: redis.Redis
) -> None:
    keys = IdempotencyKeys(client, settings.redis.key_prefix, 3600)
    created: list[str] = []
    digests: list[str] = []

    def create() -> str:
        created.append(f"exe_{len(created)}")
        return created[-1]

    def digest() -> str:
        digests.append("hash-a")
        return "hash-a"

    def once(key: str | None) -> tuple[str, bool]:
        return keys.once("alpha", ROUTE, key, digest, create, lambda made: made, lambda found: f"read {found}")

    assert once(None) == ("exe_0", False)
    assert once(None) == ("exe_1", False), "without a key, every request creates"
    assert digests == [], "no key, no digest computed"
    assert once("key-1") == ("exe_2", False)
    assert once("key-1") == ("read exe_2", True), "a retry gets what the first created, read back"
    assert created == ["exe_0", "exe_1", "exe_2"]


def test_the_same_key_with_another_body_is_refused(settings: Settings, client: redis.Redis) -> None:
    keys = IdempotencyKeys(client, settings.redis.key_prefix, 3600)
    keys.run("alpha", ROUTE, "key-1", "hash-a", lambda: "exe_a")

    with pytest.raises(IdempotencyMismatch) as refused:
        keys.run("alpha", ROUTE, "key-1", "hash-b", lambda: "exe_b")
    assert refused.value.problems[0].field == "header.Idempotency-Key"
    with pytest.raises(RequestError):
        keys.run("alpha", ROUTE, "has a space", "hash-a", lambda: "exe_c")


def test_a_concurrent_retry_waits_for_the_first_and_replays_it(settings: Settings, client: redis.Redis) -> None:
    keys = IdempotencyKeys(client, settings.redis.key_prefix, 3600)
    inside, release = threading.Event(), threading.Event()
    outcomes: dict[str, KeyResult] = {}

    def slow_create() -> str:
        inside.set()
        assert release.wait(10)
        return "exe_first"

    first = threading.Thread(target=lambda: outcomes.update(first=keys.run("alpha", ROUTE, "k", "h", slow_create)))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: outcomes.update(second=keys.run("alpha", ROUTE, "k", "h", lambda: "dup")))
    second.start()
    # The retry is waiting once it listens on the key's channel (the first announces its result there).
    channel = Keys(settings.redis.key_prefix).idempotency("alpha", ROUTE, "k")
    wait_until(lambda: dict(client.pubsub_numsub(channel)).get(channel.encode()) == 1, 10, "the retry to wait")
    assert "second" not in outcomes
    release.set()
    first.join(10)
    second.join(10)

    assert (outcomes["first"].resource_id, outcomes["first"].replayed) == ("exe_first", False)
    assert (outcomes["second"].resource_id, outcomes["second"].replayed) == ("exe_first", True)


def test_a_failed_first_attempt_gives_the_key_back(settings: Settings, client: redis.Redis) -> None:
    keys = IdempotencyKeys(client, settings.redis.key_prefix, 3600)

    def fail() -> str:
        raise RuntimeError("the queue was down")

    with pytest.raises(RuntimeError):
        keys.run("alpha", ROUTE, "k", "h", fail)
    retry = keys.run("alpha", ROUTE, "k", "h", lambda: "exe_second_try")

    assert (retry.resource_id, retry.replayed) == ("exe_second_try", False)


def test_a_request_digest_stays_as_stored_before_session_context_existed() -> None:
    """A retry after an upgrade, with the same Idempotency-Key, is still the same request."""
    import hashlib
    import json

    from execbox.executions.schemas import ExecutionCreate
    from execbox.executions.submit import request_digest

    plain = ExecutionCreate(language="python", code="1", session="ses_" + "a" * 26)
    before = plain.model_dump(mode="json")
    for added_later in ("session_context", "effect", "idempotency", "approval"):
        del before[added_later]
    stored = hashlib.sha256(json.dumps(before, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert request_digest(plain) == stored
    other = ExecutionCreate(language="python", code="1", session="ses_" + "a" * 26, session_context="python:b")
    assert request_digest(other) != stored, "a context is part of what the request asks"
