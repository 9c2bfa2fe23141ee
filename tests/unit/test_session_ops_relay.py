"""The holder's relay of file and process requests (execbox.sessions.relay.Relay) against the real
Redis and a recording sandbox: what is unreadable is set aside and the relay goes on, the sandbox
answers only the requests it was sent, a started process's output reaches whoever follows it,
followers who stop reading are dropped, and everyone still waiting hears "gone" at the end."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from execbox.keyschema import Keys
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec
from execbox.sessions import relay as relay_module
from execbox.sessions.ops import new_op
from execbox.sessions.relay import Relay
from execbox.sessions.service import new_session_id
from execbox.sessions.store import SessionStore
from execbox.settings import Settings
from tests.conftest import wait_until

pytestmark = pytest.mark.redis
WAIT_S = 5.0
EXITED = {"op": "the relay's run() returned"}
"""Put on the sandbox's queue when run() ends, so that a test waiting for a request hears that instead."""


class RecordingSandbox:
    """A SessionSandbox that keeps the requests it is sent (a queue to wait on) and lets the test
    speak as the sandbox through the listener the relay registered."""

    gone: str | None = None

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()
        self.listener: Callable[[dict[str, Any]], None] | None = None

    def run_cell(self, spec: SandboxSpec, code: str, control: SandboxControl) -> SandboxOutcome:
        raise AssertionError("the relay runs no cells")

    def close(self) -> None:
        raise AssertionError("the relay closes no sandbox")

    def op(self, request: dict[str, Any]) -> None:
        self.sent.append(request)
        self.received.put(request)

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self.listener = listener

    def say(self, event: dict[str, Any]) -> None:
        assert self.listener is not None, "the relay listens from the start"
        self.listener(event)


class Relaying:
    """A Relay running in a thread of its own, as the holder runs it."""

    def __init__(self, store: SessionStore) -> None:
        self.store, self.session_id = store, new_session_id()
        self.sandbox = RecordingSandbox()
        self.set_aside = 0
        self.relay = Relay(store, self.session_id, self.sandbox, self._set_aside)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="relay-under-test", daemon=True)
        self.thread.start()

    def _set_aside(self) -> None:
        self.set_aside += 1

    def _run(self) -> None:
        try:
            self.relay.run(self.stop)
        except BaseException as exc:  # kept for the test to see, not left to the thread's excepthook
            self.errors.append(exc)
        finally:
            self.sandbox.received.put(EXITED)

    @property
    def redis(self) -> redis.Redis:
        return self.store.redis

    def ask(self, request: dict[str, Any] | list[Any] | str | bytes) -> None:
        """Put a request on the session's ops list as the API does (raw text and bytes as they are)."""
        if isinstance(request, str | bytes):
            self.redis.rpush(self.store.keys.session_ops(self.session_id), request)
        else:
            self.store.ask(self.session_id, json.dumps(request))

    def request(self, kind: str, **fields: Any) -> str:
        op = new_op()
        self.ask({"op": kind, "id": op, **fields})
        return op

    def relayed(self) -> dict[str, Any]:
        """The next request the sandbox was sent (waiting for it)."""
        try:
            got = self.sandbox.received.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"nothing was relayed within {WAIT_S} s") from None
        assert got is not EXITED, f"the relay stopped: {self.errors!r}"
        return got

    def started(self, pid: int) -> str:
        """A proc.start relayed and answered by the sandbox with `pid`."""
        op = self.request("proc.start", argv=["sleep", "60"])
        assert self.relayed()["id"] == op
        self.sandbox.say({"ev": "reply", "id": op, "ok": {"pid": pid}})
        return op

    def watched(self, pid: int) -> str:
        """A proc.watch of `pid`, its reply read (waiting for it)."""
        op = self.request("proc.watch", pid=pid)
        assert self.next_answer(op) == {"ev": "reply", "id": op, "ok": {"pid": pid}}
        return op

    def key(self, op: str) -> str:
        return self.store.keys.session_answers(self.session_id, op)

    def next_answer(self, op: str) -> dict[str, Any]:
        """The next answer to op, read as the API reads them (a blocking pop)."""
        got = self.redis.blpop([self.key(op)], timeout=WAIT_S)
        assert got is not None, f"no answer to {op} within {WAIT_S} s"
        answer: dict[str, Any] = json.loads(got[1])
        return answer

    def answers(self, op: str) -> list[dict[str, Any]]:
        """Every answer to op not read yet (the relay pushes what the sandbox says as it hears it)."""
        return [json.loads(a) for a in self.redis.lrange(self.key(op), 0, -1)]

    def take(self, op: str) -> list[dict[str, Any]]:
        """Every answer to op, read (as an asker who keeps up)."""
        with self.redis.pipeline() as pipe:
            pipe.lrange(self.key(op), 0, -1)
            pipe.delete(self.key(op))
            taken, _ = pipe.execute()
        return [json.loads(a) for a in taken]

    def sync(self) -> None:
        """Wait until every request asked so far was handled: one more is relayed after them."""
        op = self.request("proc.list")
        assert self.relayed()["id"] == op

    def finish(self) -> None:
        """Stop the relay as the holder does when the session is over, and wait for it."""
        self.stop.set()
        self.thread.join(timeout=WAIT_S)
        assert not self.thread.is_alive(), "run() returns once stop is set"
        assert self.errors == []


@pytest.fixture
def store(settings: Settings, client: redis.Redis) -> SessionStore:
    return SessionStore(client, Keys(settings.redis.key_prefix), 60)


@pytest.fixture
def relaying(store: SessionStore) -> Iterator[Relaying]:
    running = Relaying(store)
    yield running
    running.stop.set()
    running.thread.join(timeout=WAIT_S)


def pout(pid: int, text: str = "aGk=") -> dict[str, Any]:
    return {"ev": "pout", "pid": pid, "fd": 1, "b": text}


def test_unreadable_requests_are_set_aside_and_the_next_good_one_is_relayed(relaying: Relaying) -> None:
    unknown = new_op()
    bad: list[dict[str, Any] | list[Any] | str | bytes] = [
        "not json",
        b"{truncated",
        {"id": "XYZ", "op": "fs"},
        {"id": new_op().upper(), "op": "fs"},
        {"id": new_op() + "0", "op": "fs"},
        {"id": 5, "op": "fs"},
        {"op": "fs", "call": "stat", "path": "/workspace"},
        {"id": unknown, "op": "run", "code": "print(1)"},
        {"id": new_op(), "op": ["fs"]},
        {"id": new_op()},
        [new_op(), "fs"],
        "null",
    ]
    for request in bad:
        relaying.ask(request)
    good = relaying.request("fs", call="stat", path="/workspace")

    assert relaying.relayed()["id"] == good, "the first request the sandbox is sent is the good one"
    assert relaying.set_aside == len(bad), "each unreadable request is counted once"
    assert relaying.sandbox.sent == [{"op": "fs", "id": good, "call": "stat", "path": "/workspace"}]
    assert relaying.answers(unknown) == [], "a request set aside is not answered for"
    assert relaying.redis.llen(relaying.store.keys.session_ops(relaying.session_id)) == 0
    relaying.finish()


def test_the_sandbox_is_heard_only_about_requests_it_was_sent_and_only_until_each_is_answered(
    relaying: Relaying,
) -> None:
    sent = relaying.request("fs", call="read", path="/workspace/a", limit=10)
    assert relaying.relayed()["id"] == sent
    other = new_op()  # another asker's request that this relay never sent (or one of another session)
    for event in ({"ev": "chunk", "id": other, "b": "eA=="}, {"ev": "reply", "id": other, "ok": {"pid": 1}}):
        relaying.sandbox.say(event)
    assert not relaying.redis.exists(relaying.key(other)), "nothing is written for an op the relay did not send"

    relaying.sandbox.say({"ev": "chunk", "id": sent, "b": "eA=="})
    relaying.sandbox.say({"ev": "reply", "id": sent, "ok": {}})
    relaying.sandbox.say({"ev": "reply", "id": sent, "error": {"kind": "failed", "message": "a second reply"}})
    relaying.sandbox.say({"ev": "chunk", "id": sent, "b": "eQ=="})
    assert relaying.answers(sent) == [{"ev": "chunk", "id": sent, "b": "eA=="}, {"ev": "reply", "id": sent, "ok": {}}]
    relaying.finish()
    assert relaying.answers(sent)[-1]["ev"] == "reply", "an answered request is not told gone"


def test_a_started_process_reports_to_its_starter_until_it_ends(relaying: Relaying) -> None:
    start = relaying.started(42)
    listing = relaying.request("fs", call="stat", path="/workspace")
    assert relaying.relayed()["id"] == listing
    relaying.sandbox.say({"ev": "reply", "id": listing, "ok": {"pid": 43}})  # not a start: follows nothing

    relaying.sandbox.say(pout(42))
    relaying.sandbox.say(pout(43, "b3RoZXI="))
    relaying.sandbox.say({"ev": "pout", "pid": "42", "fd": 2, "b": "eA=="})
    end = {"ev": "pend", "pid": 42, "status": 0, "signal": None}
    relaying.sandbox.say(end)
    relaying.sandbox.say(pout(42, "bGF0ZQ=="))
    relaying.sandbox.say({"ev": "pend", "pid": 42, "status": 1, "signal": None})

    assert relaying.answers(start) == [{"ev": "reply", "id": start, "ok": {"pid": 42}}, pout(42), end]
    assert relaying.answers(listing) == [{"ev": "reply", "id": listing, "ok": {"pid": 43}}]
    relaying.finish()
    assert relaying.answers(start)[-1] == end, "the process's end ended the subscription: no gone after it"


def test_watching_a_pid_that_is_not_running_answers_not_found(relaying: Relaying) -> None:
    relaying.started(42)
    for pid in (99, "42"):
        watch = relaying.request("proc.watch", pid=pid)
        answer = relaying.next_answer(watch)
        assert answer["ev"] == "reply" and answer["id"] == watch and "ok" not in answer
        assert answer["error"]["kind"] == "not_found"
    relaying.sync()
    assert [r["op"] for r in relaying.sandbox.sent] == ["proc.start", "proc.list"], "a watch is the relay's own"
    relaying.finish()


def test_a_second_watcher_hears_a_running_process_until_it_unwatches(relaying: Relaying) -> None:
    start = relaying.started(42)
    watch = relaying.watched(42)
    relaying.sandbox.say(pout(42, "b25l"))
    assert relaying.take(watch) == [pout(42, "b25l")]

    relaying.ask({"op": "proc.unwatch", "id": new_op(), "of": watch})
    relaying.sync()
    relaying.sandbox.say(pout(42, "dHdv"))
    relaying.sandbox.say({"ev": "pend", "pid": 42, "status": 0, "signal": None})
    assert relaying.answers(watch) == [], "nothing after its unwatch"
    assert [a["ev"] for a in relaying.answers(start)] == ["reply", "pout", "pout", "pend"], "the starter still hears"
    assert [r["op"] for r in relaying.sandbox.sent] == ["proc.start", "proc.list"]
    relaying.finish()
    assert relaying.answers(watch) == [], "an unwatched op is not told gone either"


def test_when_the_relay_stops_every_waiting_request_and_watcher_hears_gone(relaying: Relaying) -> None:
    gone = {"ev": "gone"}
    answered = relaying.request("fs", call="stat", path="/workspace")
    assert relaying.relayed()["id"] == answered
    relaying.sandbox.say({"ev": "reply", "id": answered, "ok": {}})
    waiting = relaying.request("fs", call="read", path="/workspace/big", limit=10)
    assert relaying.relayed()["id"] == waiting
    unanswered_start = relaying.request("proc.start", argv=["true"])
    assert relaying.relayed()["id"] == unanswered_start
    start = relaying.started(42)
    watch = relaying.watched(42)
    other_start, other_watch = relaying.started(43), relaying.watched(43)

    relaying.finish()
    assert relaying.answers(waiting) == [gone]
    assert relaying.answers(unanswered_start) == [gone]
    assert relaying.answers(start) == [{"ev": "reply", "id": start, "ok": {"pid": 42}}, gone]
    assert relaying.answers(watch) == [gone]
    assert relaying.answers(other_start)[-1] == gone and relaying.answers(other_watch) == [gone]
    assert relaying.answers(answered) == [{"ev": "reply", "id": answered, "ok": {}}], "answered: not waiting"


def test_a_watcher_that_lets_its_answers_pile_up_is_dropped(
    relaying: Relaying, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_module, "ANSWER_CAP", 3)
    slow = relaying.started(42)  # its reply is its first unread answer
    reader = relaying.watched(42)
    for n in range(3):
        relaying.sandbox.say(pout(42, f"{n}"))
        assert relaying.take(reader) == [pout(42, f"{n}")], "a watcher who reads is never dropped"
    assert relaying.answers(slow) == [
        {"ev": "reply", "id": slow, "ok": {"pid": 42}},
        pout(42, "0"),
        pout(42, "1"),
        pout(42, "2"),
        {"ev": "dropped"},
    ], "the answer past the cap is its last before dropped"

    relaying.sandbox.say(pout(42, "3"))
    assert relaying.take(reader) == [pout(42, "3")]
    assert relaying.answers(slow)[-1] == {"ev": "dropped"}, "nothing more for the dropped watcher"
    relaying.finish()
    assert relaying.answers(slow)[-1] == {"ev": "dropped"}, "a dropped watcher is not told gone"
    assert relaying.answers(reader) == [{"ev": "gone"}]


# -- what the relay does not expect -----------------------------------------------------------------


def test_a_watch_of_a_pid_that_is_not_a_number_does_not_stop_the_relay(relaying: Relaying) -> None:
    relaying.request("proc.watch", pid=[42])  # unhashable: its lookup raises inside the relay
    good = relaying.request("fs", call="stat", path="/workspace")
    assert relaying.relayed()["id"] == good
    relaying.finish()


def test_a_request_that_is_not_utf8_does_not_stop_the_relay(relaying: Relaying) -> None:
    relaying.ask(b'{"op": "fs", "id": "\xff"}')
    good = relaying.request("fs", call="stat", path="/workspace")
    assert relaying.relayed()["id"] == good
    assert relaying.sandbox.sent == [{"op": "fs", "id": good, "call": "stat", "path": "/workspace"}]
    relaying.finish()


def test_a_reply_whose_id_is_not_a_string_is_dropped_without_raising(relaying: Relaying) -> None:
    relaying.sandbox.say({"ev": "reply", "id": ["not", "an", "op"], "ok": {}})
    relaying.finish()


def test_a_directory_watchers_events_reach_its_asker_only_once_the_sandbox_confirmed_it(relaying: Relaying) -> None:
    refused = relaying.request("watch.start", path="/nowhere")
    assert relaying.relayed()["id"] == refused
    relaying.sandbox.say({"ev": "reply", "id": refused, "error": {"kind": "not_found", "message": "no"}})
    watcher = relaying.request("watch.start", path="/workspace", recursive=True)
    assert relaying.relayed()["id"] == watcher
    early = {"ev": "wev", "id": watcher, "events": [{"name": "early", "type": "create"}]}
    relaying.sandbox.say(early)  # before its reply: not yet a watcher the relay knows
    relaying.sandbox.say({"ev": "reply", "id": watcher, "ok": {}})
    change = {"ev": "wev", "id": watcher, "events": [{"name": "a.txt", "type": "write"}]}
    relaying.sandbox.say(change)
    relaying.sandbox.say({"ev": "wev", "id": refused, "events": [{"name": "x", "type": "create"}]})
    relaying.sandbox.say({"ev": "wev", "id": ["not", "an", "id"], "events": []})
    assert relaying.take(watcher) == [{"ev": "reply", "id": watcher, "ok": {}}, change]
    assert relaying.take(refused) == [{"ev": "reply", "id": refused, "error": {"kind": "not_found", "message": "no"}}]

    stop = relaying.request("watch.stop", watch=watcher)
    assert relaying.relayed() == {"op": "watch.stop", "id": stop, "watch": watcher}
    relaying.sandbox.say(change)
    assert relaying.answers(watcher) == [], "a stopped watcher's events go nowhere"


def test_a_directory_watcher_hears_gone_when_the_relay_stops(relaying: Relaying) -> None:
    watcher = relaying.request("watch.start", path="/workspace")
    assert relaying.relayed()["id"] == watcher
    relaying.sandbox.say({"ev": "reply", "id": watcher, "ok": {}})
    relaying.finish()
    assert relaying.take(watcher)[-1] == {"ev": "gone"}


def test_a_supervisor_that_leaves_a_request_unanswered_past_the_deadline_loses_the_sandbox(
    relaying: Relaying, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44 (5), control C51: a supervisor its own code stopped (SIGSTOP) answers nothing, and
    each file or process request used to wait 60 s for its 504 while the session said `ready`. Now
    an answered request is fine, and one left unanswered past the deadline loses the sandbox (its
    holder ends the session as sandbox_error, saying why)."""
    monkeypatch.setattr(relay_module, "ANSWER_DEADLINE_S", 0.5)
    answered = relaying.request("fs", call="stat", path="/workspace")
    assert relaying.relayed()["id"] == answered
    relaying.sandbox.say({"ev": "reply", "id": answered, "ok": {}})
    unanswered = relaying.request("fs", call="stat", path="/workspace")
    asked = time.monotonic()
    assert relaying.relayed()["id"] == unanswered
    wait_until(lambda: relaying.sandbox.gone is not None, WAIT_S, "the sandbox to be declared lost")
    assert time.monotonic() - asked >= 0.5, "not before the deadline"
    assert "unanswered for" in str(relaying.sandbox.gone), relaying.sandbox.gone
