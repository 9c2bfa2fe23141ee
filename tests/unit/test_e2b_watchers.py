"""The E2B facade's directory watchers (execbox.e2b.watchers): events in E2B's shape, and the book
of a sandbox's watchers against the real Redis."""

from __future__ import annotations

import json

import pytest
import redis

from execbox.core.errors import InvalidRequest
from execbox.e2b import watchers
from execbox.e2b.watchers import WatcherBook
from execbox.keyschema import Keys
from execbox.settings import Settings

SESSION = "ses_" + "b" * 26


def test_the_sandboxs_events_become_e2bs_and_anything_else_is_left_out() -> None:
    answer = {"ev": "wev", "id": "x", "events": [
        {"name": "a.txt", "type": "create"}, {"name": "b", "type": "chmod"}, {"name": "c", "type": "explode"},
        "not an event", {"type": "remove"}]}  # fmt: skip
    assert watchers._events(answer) == [
        {"name": "a.txt", "type": "EVENT_TYPE_CREATE"},
        {"name": "b", "type": "EVENT_TYPE_CHMOD"},
        {"name": "", "type": "EVENT_TYPE_REMOVE"},
    ]
    assert watchers._events({"ev": "wev", "events": "nope"}) == []


@pytest.mark.parametrize("body", [{}, {"watcherId": 5}, {"watcherId": "../x"}, {"watcherId": "A" * 24}])
def test_a_watcher_id_that_this_server_could_not_have_made_is_a_400(body: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest) as refused:
        watchers._watcher(body)
    assert [p.field for p in refused.value.problems] == ["watcherId"]


def test_a_watch_asks_the_sandbox_for_the_path_as_it_names_it() -> None:
    assert watchers._start_request({"path": "data", "recursive": True}) == {
        "op": "watch.start", "path": "/workspace/data", "recursive": True}  # fmt: skip
    assert watchers._start_request({"path": "/etc", "recursive": "yes"})["recursive"] is False
    with pytest.raises(InvalidRequest):
        watchers._start_request({"path": None})


@pytest.mark.redis
def test_the_book_knows_its_sandboxs_watchers_and_drains_their_events(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis.key_prefix)
    book = WatcherBook(client, keys, 60)
    watcher = "0123456789abcdef01234567"
    book.add(SESSION, watcher)
    assert book.has(SESSION, watcher) and not book.has("ses_" + "c" * 26, watcher)
    pending = [json.dumps({"ev": "wev", "id": watcher, "events": [{"name": str(n), "type": "write"}]})
               for n in range(3)]  # fmt: skip
    client.rpush(keys.session_answers(SESSION, watcher), *pending)
    assert book.drain(SESSION, watcher) == pending and book.drain(SESSION, watcher) == []
    book.forget(SESSION, watcher)
    assert not book.has(SESSION, watcher)
