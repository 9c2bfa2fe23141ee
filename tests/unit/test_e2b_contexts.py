"""The E2B facade's code contexts (execbox.e2b.contexts) against the real Redis: ids, languages, the
per-sandbox cap under concurrent creates, and stored entries that no longer read."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from execbox.core.errors import InvalidRequest
from execbox.e2b.contexts import HOME, MAX_CONTEXTS, ContextBook, chdir_code, language_of
from execbox.e2b.errors import ContextNotFound, TooManyContexts
from execbox.keyschema import Keys
from execbox.settings import Settings

pytestmark = pytest.mark.redis
OFFERED = ("python", "javascript", "bash")
SESSION = "ses_" + "a" * 26


@pytest.fixture
def book(settings: Settings, client: redis.Redis) -> ContextBook:
    return ContextBook(client, Keys(settings.redis.key_prefix), 60)


def test_a_language_is_named_as_the_sdk_and_users_do_and_anything_else_is_a_400() -> None:
    assert language_of(None, OFFERED, "language") == language_of(" ", OFFERED, "language") == "python"
    assert language_of("js", OFFERED, "language") == language_of("JavaScript", OFFERED, "language") == "javascript"
    assert language_of("sh", OFFERED, "language") == "bash"
    with pytest.raises(InvalidRequest) as refused:
        language_of("r", OFFERED, "language")
    assert [p.field for p in refused.value.problems] == ["language"]
    assert "offered: python, javascript, bash" in refused.value.problems[0].message
    with pytest.raises(InvalidRequest):
        language_of("javascript", ("python", "bash"), "language")


def test_each_offered_language_has_a_default_and_the_sessions_own_is_the_native_default(book: ContextBook) -> None:
    listed = book.all(SESSION, OFFERED)
    assert [(c.id, c.language, c.cwd) for c in listed] == [(lang, lang, HOME) for lang in OFFERED]
    assert book.find(SESSION, "python", OFFERED).native is None, "a plain run_code is a plain cell"
    assert book.find(SESSION, "javascript", OFFERED).native == "javascript"


def test_a_made_context_is_found_by_its_id_and_maps_to_a_native_name(book: ContextBook) -> None:
    made = book.add(SESSION, "bash", "/tmp")
    language, name = made.context.id.split("-")
    assert language == "bash" and len(name) == 10 and made.native == f"bash:{name}"
    assert book.find(SESSION, made.context.id, OFFERED) == made
    assert made.context in book.all(SESSION, OFFERED)
    book.forget(SESSION, made.context.id)
    with pytest.raises(ContextNotFound):
        book.find(SESSION, made.context.id, OFFERED)


@pytest.mark.parametrize(
    "context_id", ["ruby", "python-", "python-XYZ", "python-0123456789a", "../python", "bash-" + "0" * 10]
)
def test_an_id_it_did_not_make_names_no_context(book: ContextBook, context_id: str) -> None:
    with pytest.raises(ContextNotFound):
        book.find(SESSION, context_id, OFFERED)


def test_a_default_of_a_language_the_sandbox_does_not_offer_is_not_found(book: ContextBook) -> None:
    with pytest.raises(ContextNotFound):
        book.find(SESSION, "javascript", ("python", "bash"))


def test_the_cap_holds_when_many_create_at_once(book: ContextBook) -> None:
    made: list[str] = []
    refused: list[TooManyContexts] = []
    start = threading.Barrier(MAX_CONTEXTS + 6)

    def create() -> None:
        start.wait()
        try:
            made.append(book.add(SESSION, "python", HOME).context.id)
        except TooManyContexts as exc:
            refused.append(exc)

    threads = [threading.Thread(target=create) for _ in range(MAX_CONTEXTS + 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept = [c.id for c in book.all(SESSION, OFFERED) if "-" in c.id]
    assert sorted(kept) == sorted(made) and len(made) <= MAX_CONTEXTS and made, (made, len(refused))
    assert len(made) + len(refused) == MAX_CONTEXTS + 6


def test_a_stored_entry_that_no_longer_reads_is_skipped(book: ContextBook, client: redis.Redis) -> None:
    good = book.add(SESSION, "python", HOME)
    key = book.keys.sandbox_contexts(SESSION)
    client.hset(key, "python-00000000ff", b"\xff not json")
    client.hset(key, "bash-00000000aa", json.dumps({"language": "python", "cwd": HOME}))  # language disagrees
    client.hset(key, "bash-00000000bb", json.dumps({"language": "bash", "cwd": "rel\x00ative"}))
    assert [c.id for c in book.all(SESSION, OFFERED) if "-" in c.id] == [good.context.id]
    with pytest.raises(ContextNotFound):
        book.find(SESSION, "python-00000000ff", OFFERED)


def test_a_directory_is_quoted_for_the_language_that_moves_there() -> None:
    odd = '/tmp/it\'s "here"'
    assert chdir_code("python", odd) == "__import__('os').chdir(" + repr(odd) + ")"
    beyond = "/home/user/café-\U0001f600"
    assert eval(chdir_code("python", beyond).removeprefix("__import__('os').chdir(")[:-1]) == beyond
    assert chdir_code("javascript", odd) == "process.chdir(" + json.dumps(odd) + ")"
    assert chdir_code("bash", odd) == "cd '/tmp/it'\\''s \"here\"'"
