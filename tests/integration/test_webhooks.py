"""Webhooks: signed, retried with backoff, logged on the execution, only to allowed hosts."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from tests.conftest import Redis, Side, Stack, run_code, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]
SECRET = "receiver-secret-0123456789"


class _FlakyReceiver(BaseHTTPRequestHandler):
    """Answers 500 twice, then 200; keeps every request."""

    calls: list[tuple[int, dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = 500 if len(self.calls) < 2 else 200
        self.calls.append((status, dict(self.headers), body))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def verify(signature: str, body: bytes) -> bool:
    parts = dict(item.split("=", 1) for item in signature.split(","))
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


def test_flaky_receiver_gets_one_accepted_signed_delivery_after_three_attempts(
    side_stack: Callable[..., Side],
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        side = side_stack()
        side.worker("hooks")
        url = f"http://localhost:{server.server_address[1]}/hook"
        with side.client() as client:
            response = client.post(
                "/v1/executions?wait=60",
                json={"language": "python", "code": "print('hooked')", "webhook": {"url": url, "secret": SECRET}},
            )
            body = response.json()
            assert body["status"] == "succeeded"

            def logged() -> list[dict[str, Any]]:
                deliveries: list[dict[str, Any]] = client.get(f"/v1/executions/{body['id']}").json()[
                    "webhook_deliveries"
                ]
                return deliveries if len(deliveries) == 3 else []

            wait_until(logged, 30, "three delivery attempts on the execution")
            deliveries = logged()
        assert [d["status_code"] for d in deliveries] == [500, 500, 200]
        assert [d["error"] is None for d in deliveries] == [False, False, True]
        accepted = [(headers, payload) for status, headers, payload in _FlakyReceiver.calls if status == 200]
        assert len(_FlakyReceiver.calls) == 3 and len(accepted) == 1
        headers, payload = accepted[0]
        assert verify(headers["Execbox-Signature"], payload) and headers["Execbox-Execution-Id"] == body["id"]
        assert b'"stdout":"hooked\\n"' in payload
        assert not verify(headers["Execbox-Signature"], payload + b" ")
    finally:
        server.shutdown()
        server.server_close()


def test_callbacks_to_hosts_not_allowed_are_refused(api: Any) -> None:
    for url in ("http://169.254.169.254/latest/meta-data", "http://redis:6379/", "http://127.0.0.1:8000/v1"):
        response = api.post(
            "/v1/executions", json={"language": "python", "code": "print(1)", "webhook": {"url": url, "secret": SECRET}}
        )
        assert response.status_code == 422 and "webhook.url" in {e["field"] for e in response.json()["errors"]}
    assert run_code(api, "print(1)")["webhook_deliveries"] == []


class _CountingReceiver(BaseHTTPRequestHandler):
    """Answers 200 and counts deliveries per execution id."""

    seen: dict[str, int] = {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        execution_id = self.headers["Execbox-Execution-Id"]
        self.seen[execution_id] = self.seen.get(execution_id, 0) + 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_delivery_left_by_a_dead_worker_is_made_exactly_once_by_another(
    api: Any, stack: Stack, redis_server: Redis
) -> None:
    """The state a worker killed between writing the terminal status and sending the webhook leaves
    behind: the record is terminal and its event was taken by that worker's consumer, never
    acknowledged. Another worker takes it over once idle and delivers it, once."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CountingReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    harness = redis.Redis.from_url(redis_server.url)
    try:
        finished = run_code(api, "print('for the dead worker')")
        record = json.loads(harness.get(f"{stack.prefix}:exe:{finished['id']}") or b"{}")
        ghost_id = "exe_" + secrets.token_hex(13)[:26]
        record.update(id=ghost_id, webhook={"url": f"http://localhost:{server.server_address[1]}/h", "secret": SECRET},
                      webhook_deliveries=[])  # fmt: skip
        harness.set(f"{stack.prefix}:exe:{ghost_id}", json.dumps(record), ex=600)
        stream = f"{stack.prefix}:events"
        with harness.pipeline() as pipe:  # atomically: the event is written and taken by the dying consumer
            pipe.xadd(stream, {"type": "execution.terminal", "id": ghost_id, "status": "succeeded"})
            pipe.xreadgroup("webhooks", "dead-worker", {stream: ">"}, count=1)
            event_id, taken = pipe.execute()
        assert taken[0][1][0][0] == event_id  # pending under the dead consumer
        wait_until(lambda: _CountingReceiver.seen.get(ghost_id), 30, "another worker to deliver it")
        wait_until(lambda: not harness.xpending_range(stream, "webhooks", event_id, event_id, 1), 30, "the ack")
        assert _CountingReceiver.seen[ghost_id] == 1
        deliveries = json.loads(harness.get(f"{stack.prefix}:exe:{ghost_id}") or b"{}")["webhook_deliveries"]
        assert [d["status_code"] for d in deliveries] == [200]
    finally:
        server.shutdown()
        server.server_close()


def test_a_receiver_that_never_answers_delays_no_execution(api: Any) -> None:
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # connections complete, no answer ever comes
    try:
        url = f"http://localhost:{hole.getsockname()[1]}/never"
        hooked = api.post(
            "/v1/executions?wait=30",
            json={"language": "python", "code": "print(1)", "webhook": {"url": url, "secret": SECRET}},
        ).json()
        assert hooked["status"] == "succeeded"
        behind = [run_code(api, "print(2)") for _ in range(4)]
        assert all(b["timing"]["queue_wait_ms"] < 1000 for b in behind), [b["timing"] for b in behind]

        def attempts() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = api.get(f"/v1/executions/{hooked['id']}").json()["webhook_deliveries"]
            return found if len(found) >= 5 else []

        wait_until(attempts, 60, "every attempt to time out")
        deliveries = attempts()
        assert len(deliveries) == 5 and all(d["error"] and "Timeout" in d["error"] for d in deliveries)
    finally:
        hole.close()
