"""Issue 44, item 2 (control C49): a session's lists are capped in bytes as well as entries, and what a
session owns goes when it ends (its requests at once; its queue and answers within ANSWER_TTL_S)."""

from __future__ import annotations

import pytest
import redis

from execbox.keyschema import Keys
from execbox.sessions.errors import SessionEnded
from execbox.sessions.ops import ANSWER_CAP, ANSWER_TTL_S
from execbox.sessions.status import SessionEnd
from execbox.sessions.store import ANSWER_BYTES, ASK_BYTES, ASK_CAP, FULL, SessionStore
from execbox.settings import Settings
from execbox.tenancy.errors import RateLimited
from tests.unit.test_sessions import session

pytestmark = pytest.mark.redis
MIB = 1 << 20


def _opened(settings: Settings, client: redis.Redis) -> tuple[SessionStore, str]:
    store = SessionStore(client, Keys(settings.redis.key_prefix), 3600)
    record = session(settings)
    assert store.admit(record.tenant, record.id, 10) == "ok"
    store.create(record, settings.queue.name)
    return store, record.id


def test_a_sessions_requests_are_capped_in_entries_and_bytes(settings: Settings, client: redis.Redis) -> None:
    store, session_id = _opened(settings, client)
    for index in range(ASK_CAP):
        store.ask(session_id, f'{{"op": "fs", "n": {index}}}')
    with pytest.raises(RateLimited):
        store.ask(session_id, '{"op": "fs"}')
    assert client.llen(store.keys.session_ops(session_id)) == ASK_CAP

    while store.next_op(session_id, 0.01) is not None:  # the holder catches up: room again
        pass
    store.ask(session_id, "x" * (ASK_BYTES // 2))
    with pytest.raises(RateLimited) as refused:
        store.ask(session_id, "y" * (ASK_BYTES // 2 + 1))

    assert refused.value.http_status == 429 and "bytes waiting" in refused.value.message
    assert client.llen(store.keys.session_ops(session_id)) == 1, "a refused request is not queued"


def test_an_answer_list_is_capped_in_bytes_and_the_reader_is_told(settings: Settings, client: redis.Redis) -> None:
    store, session_id = _opened(settings, client)
    chunk = "c" * (4 * MIB)
    key = store.keys.session_answers(session_id, "a" * 24)

    waiting = [store.answer(session_id, "a" * 24, chunk, ANSWER_TTL_S) for _ in range(ANSWER_BYTES // len(chunk) + 2)]

    assert waiting[: ANSWER_BYTES // len(chunk)] == list(range(1, ANSWER_BYTES // len(chunk) + 1))
    assert waiting[-2:] == [FULL, FULL] and FULL > ANSWER_CAP, "the holder stops as at the entry cap"
    assert client.llen(key) == ANSWER_BYTES // len(chunk), "nothing past the cap"
    assert store.answer(session_id, "a" * 24, '{"ev": "dropped"}', ANSWER_TTL_S) < FULL, "the last word still fits"
    client.delete(key)  # the reader took everything: the count starts again
    assert store.answer(session_id, "a" * 24, chunk, ANSWER_TTL_S) == 1


def test_every_key_of_a_session_goes_when_it_ends(settings: Settings, client: redis.Redis) -> None:
    store, session_id = _opened(settings, client)
    store.renew_lease(session_id, "w1", 30)
    store.ask(session_id, '{"op": "fs"}')
    store.push(session_id, "exe_a")
    store.answer(session_id, "b" * 24, '{"ev": "chunk"}', ANSWER_TTL_S)

    assert store.end(session_id, SessionEnd.DELETED) is not None
    prefix = f"{settings.redis.key_prefix}:ses:{session_id}"
    left = {key.decode(): client.ttl(key) for key in client.scan_iter(match=f"{prefix}:*")}

    assert store.keys.session_ops(session_id) not in left and store.keys.session_lease(session_id) not in left
    assert all(0 < ttl <= ANSWER_TTL_S for ttl in left.values()), left
    assert store.drain(session_id) == ["exe_a"], "the holder, woken, takes what will not run"
    with pytest.raises(SessionEnded):
        store.ask(session_id, '{"op": "fs"}')
    rest = {key.decode() for key in client.scan_iter(match=f"{prefix}:*")}
    assert rest == {store.keys.session_answers(session_id, "b" * 24)}, "only an answer list, for its reader's last word"
