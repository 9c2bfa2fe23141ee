"""Sessions and live output, the pure parts and the stores: the session store's compare-and-set
and quota against the real Redis, a call's artifacts and rich results from the collector, the
capture's hold-back of the end marker, and the live-output writer."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from execbox.catalog.policies import PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.executions.classify import classify
from execbox.executions.live import LiveOutput
from execbox.executions.outputs import rich_results
from execbox.files.blobs import LocalArtifactStore
from execbox.files.collect import ArtifactCaps, Collector
from execbox.keyschema import Keys
from execbox.sandbox.docker import kernel
from execbox.sandbox.docker.capture import STDOUT, AttachCapture
from execbox.sandbox.fake import FakeKernel, FakeRuntime
from execbox.sandbox.protocol import done_marker
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec
from execbox.sessions.host import SessionHost
from execbox.sessions.record import SessionRecord
from execbox.sessions.service import new_session_id
from execbox.sessions.status import SessionEnd, SessionStatus
from execbox.sessions.store import WAKE, SessionStore
from execbox.settings import Settings
from execbox.worker import context
from execbox.worker.context import WorkerContext
from execbox.worker.reaper import report_health
from tests.conftest import wait_until
from tests.unit.conftest import InProcess
from tests.unit.test_artifacts import REG, stream
from tests.unit.test_reaper_and_pool import LIMITS, template


def session(settings: Settings, tenant: str = "alpha") -> SessionRecord:
    now = time.time()
    policy = PolicySet.load(settings.policies_dir).resolve(PolicyRequest(), 0)
    return SessionRecord(id=new_session_id(), tenant=tenant, status=SessionStatus.STARTING, language="python",
                         created_at=now, expires_at=now + 60, idle_timeout_s=60, max_lifetime_s=600,
                         last_activity_at=now, policy=policy, trace_id="0" * 32)  # fmt: skip


@pytest.mark.redis
def test_the_quota_counts_open_sessions_and_ending_one_frees_its_slot(settings: Settings, client: redis.Redis) -> None:
    store = SessionStore(client, Keys(settings.redis.key_prefix), 60)
    records = [session(settings) for _ in range(3)]
    assert [store.admit("alpha", r.id, 2) for r in records] == ["ok", "ok", "tenant"]
    assert store.admit("alpha", records[0].id, 2) == "ok", "admitting the same session again is not a second slot"
    assert store.admit("beta", records[2].id, 2) == "ok", "per tenant"
    for record in records[:2]:
        store.create(record, settings.queue.name)
    assert store.next_start(settings.queue.name, 0.1) == records[0].id, "sessions start in creation order"

    ended = store.end(records[0].id, SessionEnd.DELETED)
    assert ended is not None and ended.status is SessionStatus.ENDED and ended.ended_at is not None
    assert store.end(records[0].id, SessionEnd.IDLE_TIMEOUT) is None, "an ended session stays as it ended"
    assert store.admit("alpha", records[2].id, 2) == "ok", "its slot is free again"
    assert set(store.live()) == {records[1].id, records[2].id}, "admitted sessions count in the fleet until they end"
    assert store.pop(records[0].id, 0.1) == WAKE, "its holder is woken"


@pytest.mark.redis
def test_ending_for_a_worker_or_while_unclaimed_checks_who_holds_it(settings: Settings, client: redis.Redis) -> None:
    store = SessionStore(client, Keys(settings.redis.key_prefix), 60)
    record = session(settings)
    store.create(record, settings.queue.name)

    def claim(r: SessionRecord) -> bool:
        r.worker = "w1"
        return True

    store.update(record.id, claim)
    assert store.end(record.id, SessionEnd.WORKER_LOST, worker="w2") is None, "not w2's"
    assert store.end(record.id, SessionEnd.SANDBOX_ERROR, unclaimed=True) is None, "w1 took it"
    assert store.end(record.id, SessionEnd.WORKER_LOST, worker="w1") is not None


@pytest.mark.redis
def test_waiting_executions_are_drained_once(settings: Settings, client: redis.Redis) -> None:
    store = SessionStore(client, Keys(settings.redis.key_prefix), 60)
    sid = new_session_id()
    for execution_id in ("exe_1", "exe_2"):
        store.push(sid, execution_id)
    client.rpush(Keys(settings.redis.key_prefix).session_cells(sid), WAKE)
    assert store.drain(sid) == ["exe_1", "exe_2"]
    assert store.drain(sid) == []


def test_a_call_keeps_only_the_files_it_changed_and_its_rich_results(tmp_path: Path) -> None:
    index = json.dumps([{"kind": "execute_result", "files": {"text/plain": "0.txt", "text/html": "0.html"}},
                        {"kind": "display_data", "files": {"image/png": "1.png"}}]).encode()  # fmt: skip
    store = LocalArtifactStore(tmp_path)
    collector = Collector("exe_" + "b" * 26, store, ArtifactCaps(1000, 5000, 10), only=frozenset({"new.txt"}))
    collector(stream(("out/old.txt", REG, b"earlier", ""), ("out/new.txt", REG, b"now", ""),
                     ("out/.execbox/results/index.json", REG, index, ""),
                     ("out/.execbox/results/0.txt", REG, b"42", ""),
                     ("out/.execbox/results/0.html", REG, b"<b>42</b>", ""),
                     ("out/.execbox/results/1.png", REG, b"\x89PNG....", "")))  # fmt: skip
    assert [a.name for a in collector.kept] == ["new.txt"], "old.txt belongs to an earlier call"
    results = rich_results(collector.execution_id, collector, store)
    assert [r.kind for r in results] == ["execute_result", "display_data"]
    assert results[0].data["text/plain"].text == "42" and results[0].data["text/html"].text == "<b>42</b>"
    png = results[1].data["image/png"]
    assert png.text is None and png.size == 8 and png.url.endswith("/results/1.png")


def test_a_result_over_the_file_cap_is_listed_not_kept(tmp_path: Path) -> None:
    index = json.dumps([{"kind": "display_data", "files": {"image/png": "0.png"}}]).encode()
    collector = Collector("exe_" + "c" * 26, LocalArtifactStore(tmp_path), ArtifactCaps(10, 5000, 10), only=frozenset())
    collector(stream(("out/.execbox/results/index.json", REG, index, ""),
                     ("out/.execbox/results/0.png", REG, b"x" * 11, "")))  # fmt: skip
    assert rich_results(collector.execution_id, collector, LocalArtifactStore(tmp_path)) == []
    assert collector.not_kept and "result 0.png" == collector.not_kept[0]["name"]


def test_live_output_holds_back_only_what_may_start_the_end_marker() -> None:
    told: list[bytes] = []
    marker = done_marker("abc123")
    capture = AttachCapture(1 << 20, marker, threading.Event(), lambda fd, data: told.append(data))
    capture.take(STDOUT, b"tick 1\n")
    assert told == [b"tick 1"], "a trailing newline may be the marker's first byte"
    capture.take(STDOUT, b"tick 2\n")
    assert b"".join(told) == b"tick 1\ntick 2"
    capture.take(STDOUT, marker + b"0:0:0:0:\x00")
    assert b"".join(told) == b"tick 1\ntick 2\n", "all of the program's output, none of the marker"
    assert capture.marked[STDOUT]


@pytest.mark.parametrize(
    ("stderr", "category"),
    [
        (b"  Cell In [3], line 1\n    def broken(:\n               ^\nSyntaxError: invalid syntax\n", "code.syntax"),
        (
            b"---\nZeroDivisionError    Traceback (most recent call last)\nCell In[1], line 1\n----> 1 1/0\n\n"
            b"ZeroDivisionError: division by zero\n",
            "code.exception",
        ),  # IPython 9
    ],
)
def test_an_ipython_report_is_categorized(stderr: bytes, category: str) -> None:
    verdict = classify(SandboxOutcome(exit_code=1, stdout=b"", stderr=stderr, stdout_total=0, stderr_total=len(stderr)),
                       "python", LIMITS)  # fmt: skip
    assert verdict.error is not None and verdict.error.category.value == category


@pytest.mark.redis
def test_live_output_is_coalesced_capped_and_flushed_on_close(settings: Settings, client: redis.Redis) -> None:
    keys = Keys(settings.redis.key_prefix)
    live = LiveOutput(client, keys, "exe_live", cap=10, ttl_s=60)
    live.write(1, "é".encode()[:1])  # half a character: decoded once the rest arrives
    live.write(1, "é".encode()[1:] + b"abc")
    live.write(2, b"err")
    live.write(1, b"0123456789")  # passes the cap of 10
    live.close()
    entries: Any = client.xrange(keys.stream("exe_live"))
    events = [(e[b"event"].decode(), json.loads(e[b"data"])) for _, e in entries]
    stdout = "".join(d["text"] for e, d in events if e == "stdout")
    assert stdout == "éabc01234", "the first 10 bytes (é is two), decoded across the split"
    assert "".join(d["text"] for e, d in events if e == "stderr") == "err"
    assert [d for e, d in events if e == "truncated"] == [{"stream": "stdout", "cap_bytes": 10}]
    assert 0 < client.ttl(keys.stream("exe_live")) <= 60


def test_a_sandbox_that_stops_reading_its_requests_loses_the_session_within_the_send_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 44 (5): the sandbox's code stops its supervisor (SIGSTOP) and a 4 MiB file write fills
    the attach stream; the worker's write used to wait on it for ever, holding the send lock, so the
    next call blocked too. Now every write has a deadline: the call behind the stuck write gives up
    at the cell's (shorter) one, the write at its own, and the session is lost, saying why."""
    monkeypatch.setattr(kernel, "SEND_TIMEOUT_S", 3.0)
    monkeypatch.setattr(kernel, "CELL_SEND_TIMEOUT_S", 0.3)
    worker_end, sandbox_end = socket.socketpair()  # the sandbox's end is never read
    worker_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    container = kernel.KernelContainer(cast(kernel.KernelHost, None), template(), "ses_x")
    container._raw, container.container_id = worker_end, "c1"
    request = {"op": "fs", "id": "a" * 24, "b": "A" * (4 << 20)}
    writing = threading.Thread(target=container.op, args=(request,), daemon=True)
    started = time.monotonic()
    writing.start()
    wait_until(lambda: container._send_lock.locked(), 5, "the write to hold the send lock")
    outcome = container.run_cell(dataclasses.replace(template(), execution_id="exe_1"), "1", SandboxControl())
    assert writing.is_alive() and time.monotonic() - started < 3.0, "the call gave up first, at its own deadline"
    assert container.gone is not None and "took no request for" in container.gone, container.gone
    assert outcome.launcher_fault == container.gone and outcome.exit_code is None
    writing.join(10)
    assert not writing.is_alive(), "the write gave up at its deadline"
    worker_end.close()
    sandbox_end.close()


class _Stuck(FakeKernel):
    """A call that only the container's removal ends (what a stopped supervisor leaves the worker with)."""

    def __init__(self, runtime: FakeRuntime, spec: SandboxSpec, session_id: str) -> None:
        super().__init__(runtime, spec, session_id)
        self.removed = threading.Event()
        self.entered = threading.Event()

    def run_cell(self, spec: SandboxSpec, code: str, control: SandboxControl) -> SandboxOutcome:
        self.entered.set()
        self.removed.wait(30)
        return SandboxOutcome(exit_code=None, stdout=b"", stderr=b"", stdout_total=0, stderr_total=0,
                              launcher_fault=self.gone)  # fmt: skip

    def close(self) -> None:
        super().close()
        self.removed.set()


def _ended(http: InProcess, headers: dict[str, str], sid: str) -> dict[str, Any] | None:
    """The session once it has ended, else None."""
    body: dict[str, Any] = http.get(f"/v1/sessions/{sid}", headers=headers).json()
    return body if body["status"] == "ended" else None


@contextlib.contextmanager
def _hosting(settings: Settings, worker: str, fake: FakeRuntime) -> Iterator[WorkerContext]:
    """A worker `worker` on `fake` with its session host running, stopped and uninstalled after."""
    ctx = WorkerContext.build(settings, worker, fake)
    context.install(ctx)
    report_health(ctx)
    host, stop = SessionHost(ctx), threading.Event()
    intake = threading.Thread(target=host.run, args=(stop,), daemon=True)
    intake.start()
    try:
        yield ctx
    finally:
        stop.set()
        intake.join(5)
        host.join(5)
        context._current = None
        ctx.store.redis.close()


@pytest.mark.redis
def test_a_session_ends_at_its_lifetime_even_in_a_call_that_does_not_return(
    settings: Settings, client: redis.Redis, api: tuple[InProcess, dict[str, dict[str, str]]]
) -> None:
    """Issue 44 (5), control C51: the lifetime used to be checked only between calls, so a call the
    sandbox kept from returning held the session `ready` (and a fleet slot) past its lifetime. Now
    the lease keeper ends it on time, removes the container, and the slot is free again."""
    http, headers = api
    fake = FakeRuntime()
    stuck: dict[str, _Stuck] = {}

    def open_stuck(spec: SandboxSpec, session_id: str, start_timeout_s: float) -> FakeKernel:
        stuck[session_id] = _Stuck(fake, spec, session_id)
        return stuck[session_id]

    fake.open_session = open_stuck  # type: ignore[method-assign]
    with _hosting(settings, "w-life", fake) as ctx:
        opened = http.post("/v1/sessions", json={"language": "python", "max_lifetime_s": 2}, headers=headers["alpha"])
        assert opened.status_code == 201, opened.text
        sid = opened.json()["id"]
        call = http.post("/v1/executions", json={"language": "python", "code": "hang()", "session": sid},
                         headers=headers["alpha"])  # fmt: skip
        assert call.status_code in (201, 202), call.text
        wait_until(lambda: sid in stuck and stuck[sid].entered.is_set(), 10, "the call to start")
        record: Any = wait_until(partial(_ended, http, headers["alpha"], sid), 10, "the session's lifetime to end it")
        assert record["end_reason"] == "max_lifetime", record
        late = record["ended_at"] - record["created_at"] - 2
        assert late < settings.worker.lease_s / 3 + 1, f"ended {late:.2f} s after its lifetime"
        assert stuck[sid].removed.wait(5), "its container is removed"
        assert sid not in ctx.sessions.live(), "its fleet slot is free"
        done: Any = wait_until(lambda: (b := http.get(f"/v1/executions/{call.json()['id']}",
                                                       headers=headers["alpha"]).json())["status"] == "failed" and b,
                               10, "the cut call to end")  # fmt: skip
        assert "reached its lifetime" in done["error"]["message"], done


@pytest.mark.redis
def test_a_sandbox_lost_between_calls_ends_its_session_at_once(
    settings: Settings, client: redis.Redis, api: tuple[InProcess, dict[str, dict[str, str]]]
) -> None:
    """Issue 44: a reply longer than the worker reads (files.list over a big tree) cut the worker off
    the sandbox between calls, and the session still said `ready` while every later file call 504ed
    after 60 s. Now its holder ends it as soon as the sandbox is lost, saying why."""
    http, headers = api
    fake = FakeRuntime()
    with _hosting(settings, "w-lost", fake):
        opened = http.post("/v1/sessions", json={"language": "python"}, headers=headers["alpha"])
        assert opened.status_code == 201, opened.text
        sid = opened.json()["id"]
        wait_until(lambda: http.get(f"/v1/sessions/{sid}", headers=headers["alpha"]).json()["status"] == "ready", 10,
                   "the session to start")  # fmt: skip
        fake.sessions[sid].gone = "the session's supervisor sent an oversized line; the session was closed"
        ended: Any = wait_until(lambda: (b := http.get(f"/v1/sessions/{sid}", headers=headers["alpha"]).json())
                                ["status"] == "ended" and b, 5, "the lost session to end")  # fmt: skip
        assert ended["end_reason"] == "sandbox_error" and "oversized line" in ended["error"]["message"], ended
        wait_until(lambda: fake.sessions[sid].closed, 5, "its container to be removed")


@pytest.mark.redis
def test_idle_sessions_at_their_lifetime_end_for_it_not_as_a_lost_sandbox(
    settings: Settings, client: redis.Redis, api: tuple[InProcess, dict[str, dict[str, str]]]
) -> None:
    """The lease keeper and the holder's loop both wake when an idle session's lifetime passes. The
    keeper used to mark the sandbox gone before ending the session, and a loop that looked between
    the two ended it as sandbox_error (CI, stop 52). Several sessions make the race likely."""
    http, headers = api
    with _hosting(settings, "w-idle-life", FakeRuntime()):
        sids = []
        for tenant in ("alpha", "alpha", "beta"):  # as many as the fleet's fair shares admit
            opened = http.post("/v1/sessions", json={"language": "python", "max_lifetime_s": 1},
                               headers=headers[tenant])  # fmt: skip
            assert opened.status_code == 201, opened.text
            sids.append((tenant, opened.json()["id"]))
        for tenant, sid in sids:
            record: Any = wait_until(
                partial(_ended, http, headers[tenant], sid), 10, "the session's lifetime to end it"
            )
            assert record["end_reason"] == "max_lifetime" and record["error"] is None, record
