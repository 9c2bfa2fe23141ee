"""The poison-proof loop mechanism against a real Redis: a failing entry or due record is retried
with backoff, then set aside as a dead letter while the items behind it go on; a loop that dies is
restarted and /readyz says so meanwhile; an operator lists, shows, replays and drops dead letters
with the CLI under the admin role."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
import redis
from prometheus_client import CollectorRegistry

from execbox.cli import main
from execbox.core.deadletters import DeadLetters
from execbox.core.metrics import loop_metrics
from execbox.core.poison import Guard, Loops, consume
from execbox.core.redis_roles import role_url
from execbox.core.streams import EventStream
from execbox.keyschema import LOOPS, Keys
from execbox.settings import Settings
from tests.conftest import PASSWORDS, PREFIX, Redis, wait_until
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_a_failing_entry_is_retried_with_backoff_then_set_aside_while_the_next_ones_go_on(
    client: redis.Redis, settings: Settings, stop: threading.Event
) -> None:
    keys = Keys(settings.redis.key_prefix)
    stream = EventStream(client, keys.events)
    registry = CollectorRegistry()
    guard = Guard(client, keys, "webhooks", (keys.events,), loop_metrics(registry), max_attempts=3, backoff_s=0.2)
    attempts: list[float] = []
    handled: dict[str, float] = {}

    def handle(fields: dict[str, str]) -> None:
        if fields["id"] == "poison":
            attempts.append(time.monotonic())
            raise KeyError("a field this consumer needs")  # not a ServiceError: it used to kill the thread
        handled[fields["id"]] = time.monotonic()

    client.xadd(keys.events, {"type": "x", "id": "poison"})
    thread = threading.Thread(target=consume, args=(stream, "g", "c1", handle, stop, guard, 30.0, 0.05), daemon=True)
    thread.start()
    sent = {}
    for n in range(5):  # another tenant's entries, while the poison is retried
        sent[f"ok{n}"] = time.monotonic()
        client.xadd(keys.events, {"type": "x", "id": f"ok{n}"})
        time.sleep(0.1)  # spaced out, as real traffic is

    wait_until(lambda: DeadLetters(client, keys, LOOPS).list("webhooks"), 10, "the poison to be set aside")
    (letter,) = DeadLetters(client, keys, LOOPS).list("webhooks")
    delays = [handled[i] - sent[i] for i in sent]
    print(f"other entries handled within {max(delays) * 1000:.0f} ms while the poison was retried")  # noqa: T201
    assert max(delays) < 1.0, delays
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert len(attempts) == 3 and gaps[0] >= 0.15 and gaps[1] >= 0.35, f"backoff 0.2 s then 0.4 s: {gaps}"
    assert letter.kind == "entry" and letter.fields == {"type": "x", "id": "poison"} and letter.group == "g"
    assert letter.attempts == 3 and letter.error.startswith("KeyError")
    assert client.xpending(keys.events, "g")["pending"] == 0, "acknowledged once set aside"
    assert registry.get_sample_value("execbox_poison_total", {"loop": "webhooks"}) == 3
    assert registry.get_sample_value("execbox_dead_letters_total", {"loop": "webhooks"}) == 1
    assert thread.is_alive()


def test_a_failing_due_record_is_put_back_later_then_set_aside_never_first_in_line_for_ever(
    client: redis.Redis, settings: Settings
) -> None:
    keys = Keys(settings.redis.key_prefix)
    due = keys.schedules_due
    guard = Guard(client, keys, "scheduler", (due,), max_attempts=2, backoff_s=30.0)
    client.zadd(due, {"broken": 0, "fine": 1})

    def handle(member: str) -> None:
        if member == "broken":
            raise ValueError("cannot be read")
        client.zadd(due, {member: time.time() + 60})

    for member in [m.decode() for m in client.zrangebyscore(due, "-inf", time.time())]:  # type: ignore[union-attr]
        guard.record(due, member, partial(handle, member))
    assert (client.zscore(due, "broken") or 0) > time.time() + 25, "backed off, behind the others"
    assert client.zrangebyscore(due, "-inf", time.time()) == []
    client.zadd(due, {"broken": 0})  # its backoff passed
    assert not guard.record(due, "broken", lambda: handle("broken"))
    assert client.zscore(due, "broken") is None, "taken out of the set on its last attempt"
    (letter,) = DeadLetters(client, keys, LOOPS).list("scheduler")
    assert (letter.kind, letter.item, letter.source, letter.attempts) == ("record", "broken", due, 2)


def test_a_loop_that_dies_is_restarted_and_readyz_names_it_until_it_runs(api: Api) -> None:
    http, _ = api
    loops: Loops = http.app.state.loops
    assert http.get("/readyz").json()["checks"]["loops"]["ok"], "plans, scheduler and surprises run"
    runs: list[float] = []
    healed = threading.Event()

    def fragile(stop: threading.Event) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise RuntimeError("a bug in the loop itself")
        healed.set()
        stop.wait()

    loops.start("sessions", fragile)
    wait_until(lambda: loops.status()["sessions"].restarts == 1, 5, "the loop to die once")
    check = http.get("/readyz").json()["checks"]["loops"]
    assert not check["ok"] and "sessions" in check["detail"], check
    assert check["loops"]["sessions"]["last_error"] == "RuntimeError: a bug in the loop itself"
    assert healed.wait(5), "restarted after its pause"
    assert http.get("/readyz").json()["checks"]["loops"]["ok"]
    assert loops.status()["sessions"].restarts == 1 and runs[1] - runs[0] >= 0.9
    metrics = http.get("/metrics").text
    assert 'execbox_loop_restarts_total{loop="sessions"} 1.0' in metrics
    assert 'execbox_dead_letters{loop="plans"} 0.0' in metrics, "the gauge the alert watches"


def test_dead_letters_are_listed_shown_replayed_and_dropped_with_the_cli_as_the_admin_role(
    redis_server: Redis, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stop: threading.Event
) -> None:
    """The loops write dead letters with their own role (api here); the operator's CLI reaches them
    with the admin role, which cannot touch the loops' own keys: the loop itself puts a replay back."""
    keys = Keys(PREFIX)
    api = redis.Redis.from_url(role_url(redis_server.url, "api", PASSWORDS["api"]))
    due = keys.schedules_due
    member = f"sch_{secrets.token_hex(6)}"
    guard = Guard(api, keys, "scheduler", (due,), max_attempts=1)
    assert not guard.record(due, member, lambda: json.loads("{broken"))
    monkeypatch.setenv("EXECBOX_REDIS__URL", role_url(redis_server.url, "admin", PASSWORDS["admin"]))
    monkeypatch.setenv("EXECBOX_REDIS__KEY_PREFIX", PREFIX)
    admin = redis.Redis.from_url(role_url(redis_server.url, "admin", PASSWORDS["admin"]))
    with pytest.raises(redis.exceptions.NoPermissionError):
        admin.zadd(due, {member: 0})  # the admin role cannot put it back itself

    def cli(*argv: str) -> tuple[int, str]:
        code = main(["dead-letters", *argv])
        return code, capsys.readouterr().out

    try:
        code, listed = cli("list", "--loop", "scheduler")
        (line,) = [line for line in listed.splitlines() if member in line]
        letter_id = line.split()[1]
        assert code == 0 and "JSONDecodeError" in line
        code, shown = cli("show", "scheduler", letter_id)
        assert code == 0 and json.loads(shown)["item"] == member and json.loads(shown)["source"] == due
        assert cli("replay", "scheduler", letter_id)[0] == 0
        assert cli("show", "scheduler", letter_id)[0] == 1, "no longer a dead letter"
        assert guard.replay() == 1 and api.zscore(due, member) is not None, "the loop put it back, due now"
        assert not guard.record(due, member, lambda: json.loads("{broken"))  # still broken: set aside again
        (again,) = [d for d in DeadLetters(api, keys, LOOPS).list("scheduler") if d.item == member]
        code, _ = cli("drop", "scheduler", again.id)
        assert code == 0 and [d for d in DeadLetters(api, keys, LOOPS).list("scheduler") if d.item == member] == []
        assert cli("drop", "scheduler", again.id)[0] == 1
    finally:
        harness = redis.Redis.from_url(redis_server.url)
        harness.delete(keys.dead_letters("scheduler"), keys.replays("scheduler"))
        harness.zrem(due, member)
        harness.acl_log_reset()  # the refusal above was on purpose


def test_a_replayed_entry_goes_back_to_its_own_consumer_group_only(client: redis.Redis, settings: Settings) -> None:
    keys = Keys(settings.redis.key_prefix)
    stream = EventStream(client, keys.events)
    guards = {"a": Guard(client, keys, "plans", (keys.events,), max_attempts=1), "b": Guard(client, keys, "surprises")}
    seen: dict[str, list[str]] = {"a": [], "b": []}
    fixed = threading.Event()

    def handle(group: str, fields: dict[str, str]) -> None:
        if group == "a" and not fixed.is_set():
            raise ValueError("a bug in group a's handler")
        seen[group].append(fields["id"])

    def round_of_each() -> None:
        for group, guard in guards.items():
            stream.ensure_group(group)
            for entry_id, fields in stream.read(group, "c", block_s=0.01, idle_s=30.0):
                guard.entry(stream, group, "c", entry_id, fields, partial(handle, group), 30.0)

    client.xadd(keys.events, {"type": "x", "id": "e1"})
    round_of_each()
    assert seen == {"a": [], "b": ["e1"]}
    (letter,) = DeadLetters(client, keys, LOOPS).list("plans")
    fixed.set()  # the operator fixed the cause, then replays
    assert DeadLetters(client, keys, LOOPS).replay("plans", letter.id)
    assert guards["a"].replay() == 1
    round_of_each()
    assert seen == {"a": ["e1"], "b": ["e1"]}, "group b does not handle the replay a second time"
    assert DeadLetters(client, keys, LOOPS).list("plans") == []
