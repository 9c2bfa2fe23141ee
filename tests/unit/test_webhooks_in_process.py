"""Webhooks on the in-process stack: signed, retried with backoff and logged on the execution, only
to allowed hosts, and a delivery a dead worker left taken over by another exactly once. The
receiver is a real HTTP server on loopback and the worker's real webhook consumer runs in a thread,
as `execbox worker` runs it; executions run on the fake sandbox."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.webhooks.delivery import GROUP, WebhookConsumer
from tests.conftest import Redis, wait_until
from tests.unit.stack import InStack, in_stack

pytestmark = pytest.mark.redis
SECRET = "receiver-secret-0123456789"
LOOPBACK = {"allow_hosts": ["127.0.0.1"], "backoff_s": 0.2}
"""The webhook settings of these tests: the receiver below listens on loopback."""


class Receiver:
    """A webhook receiver on loopback: answers each POST with the next of `answers` (the last one
    for ever after) and keeps every request as (status it answered, headers, body)."""

    def __init__(self, answers: Sequence[int] = (200,)) -> None:
        self.calls: list[tuple[int, dict[str, str], bytes]] = []
        calls, lock = self.calls, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    status = answers[min(len(calls), len(answers) - 1)]
                    calls.append((status, dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def delivering(inproc: InStack, name: str = "w-fake") -> Iterator[WebhookConsumer]:
    """The worker's webhook consumer (the `webhooks` group) in a thread, as `execbox worker` runs it."""
    consumer = WebhookConsumer(inproc.worker.store, inproc.settings.webhooks, name)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), name=f"webhooks-{name}", daemon=True)
    thread.start()
    try:
        yield consumer
    finally:
        stop.set()
        thread.join(10)


def verify(signature: str, body: bytes) -> bool:
    parts = dict(item.split("=", 1) for item in signature.split(","))
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


def test_flaky_receiver_gets_one_accepted_signed_delivery_after_three_attempts(
    redis_server: Redis, tmp_path: Path
) -> None:
    with (
        in_stack(redis_server, tmp_path, webhooks=LOOPBACK) as inproc,
        inproc.client() as api,
        Receiver(answers=(500, 500, 200)) as receiver,
        delivering(inproc),
    ):
        created = api.post("/v1/executions", json={"language": "python", "code": "print('hooked')",
                                                   "webhook": {"url": receiver.url, "secret": SECRET}})  # fmt: skip
        assert created.status_code == 202, created.text
        assert inproc.run_all() == [created.json()["id"]]
        body = api.get(f"/v1/executions/{created.json()['id']}").json()
        assert body["status"] == "succeeded"

        def logged() -> list[dict[str, Any]]:
            deliveries: list[dict[str, Any]] = api.get(f"/v1/executions/{body['id']}").json()["webhook_deliveries"]
            return deliveries if len(deliveries) == 3 else []

        deliveries: Any = wait_until(logged, 10, "three delivery attempts on the execution")
    assert [d["status_code"] for d in deliveries] == [500, 500, 200]
    assert [d["error"] is None for d in deliveries] == [False, False, True]
    accepted = [(headers, payload) for status, headers, payload in receiver.calls if status == 200]
    assert len(receiver.calls) == 3 and len(accepted) == 1
    headers, payload = accepted[0]
    assert verify(headers["Execbox-Signature"], payload) and headers["Execbox-Execution-Id"] == body["id"]
    assert [h["Execbox-Delivery-Attempt"] for _, h, _ in receiver.calls] == ["1", "2", "3"]
    assert b'"stdout":"hooked\\n"' in payload
    assert not verify(headers["Execbox-Signature"], payload + b" ")


def test_callbacks_to_hosts_not_allowed_are_refused(redis_server: Redis, tmp_path: Path) -> None:
    """The operator allows `localhost` (as the integration stack does): the metadata address, an
    internal service's name and loopback by its address are still refused."""
    with (
        in_stack(redis_server, tmp_path, webhooks={"allow_hosts": ["localhost"]}) as inproc,
        inproc.client() as api,
    ):

        def hooked(url: str) -> httpx.Response:
            webhook = {"url": url, "secret": SECRET}
            return api.post("/v1/executions", json={"language": "python", "code": "print(1)", "webhook": webhook})

        for url in ("http://169.254.169.254/latest/meta-data", "http://redis:6379/", "http://127.0.0.1:8000/v1"):
            response = hooked(url)
            assert response.status_code == 422 and "webhook.url" in {e["field"] for e in response.json()["errors"]}
        allowed = hooked("http://localhost:9/h")
        assert allowed.status_code == 202, "the allowed host is accepted: the refusals above are the host's"
        plain = api.post("/v1/executions", json={"language": "python", "code": "print(1)"}).json()
        inproc.run_all()
        assert api.get(f"/v1/executions/{plain['id']}").json()["webhook_deliveries"] == []


def test_a_delivery_left_by_a_dead_worker_is_made_exactly_once_by_another(redis_server: Redis, tmp_path: Path) -> None:
    """The state a worker killed between writing the terminal status and sending the webhook leaves
    behind: the record is terminal and its event was taken by that worker's consumer, never
    acknowledged. Another worker takes it over once idle and delivers it, once."""
    hooks = {**LOOPBACK, "claim_idle_s": 0.3}
    with (
        in_stack(redis_server, tmp_path, webhooks=hooks) as inproc,
        inproc.client() as api,
        Receiver() as receiver,
    ):
        finished = api.post("/v1/executions", json={"language": "python", "code": "print('for the dead worker')"})
        inproc.run_all()
        harness, keys = inproc.redis, inproc.worker.store.keys
        record = json.loads(harness.get(keys.execution(finished.json()["id"])) or b"{}")
        assert record["status"] == "succeeded", record
        ghost_id = "exe_" + secrets.token_hex(13)[:26]
        record.update(id=ghost_id, webhook={"url": receiver.url, "secret": SECRET}, webhook_deliveries=[])
        harness.set(keys.execution(ghost_id), json.dumps(record), ex=600)
        stream = keys.events
        harness.xgroup_create(stream, GROUP, id="$", mkstream=True)  # the group as the dead worker left it
        with harness.pipeline() as pipe:  # atomically: the event is written and taken by the dying consumer
            pipe.xadd(stream, {"type": "execution.terminal", "id": ghost_id, "status": "succeeded"})
            pipe.xreadgroup(GROUP, "dead-worker", {stream: ">"}, count=1)
            event_id, taken = pipe.execute()
        assert taken[0][1][0][0] == event_id  # pending under the dead consumer

        with delivering(inproc, "w-other"):
            wait_until(lambda: receiver.calls, 10, "another worker to deliver it")
            wait_until(lambda: not harness.xpending_range(stream, GROUP, event_id, event_id, 1), 10, "the ack")
        assert [c[1]["Execbox-Execution-Id"] for c in receiver.calls] == [ghost_id]
        deliveries = json.loads(harness.get(keys.execution(ghost_id)) or b"{}")["webhook_deliveries"]
        assert [d["status_code"] for d in deliveries] == [200]
