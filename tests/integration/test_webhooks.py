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
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import (
    EXECBOX,
    Processes,
    Redis,
    Side,
    Stack,
    answers_200,
    as_role,
    auth,
    create_key,
    deployment_env,
    free_port,
    run_code,
    start_redis,
    wait_until,
)

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


class _Hole:
    """A receiver that accepts connections and never answers; it notes when each one opened and
    when the sender gave up on it (closed)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.opened = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.opened.set()
        with conn:
            while conn.recv(65536):  # b"": the sender closed its end (its timeout)
                pass
        self.closed.set()


@pytest.mark.serial
def test_a_receiver_that_never_answers_delays_no_execution(stack: Stack, processes: Processes, tmp_path: Path) -> None:
    """A deployment of its own with one worker, whose deliveries wait 20 s for an answer: while that
    worker's delivery hangs on a receiver that never answers, the same worker runs the executions
    behind it (if a delivery held the thread that runs executions, none could finish before the
    hanging request is given up)."""
    port, prefix = free_port(), f"{stack.prefix}wh"
    start_redis(processes, port, tmp_path, prefix)
    env = {**deployment_env(stack, port, prefix, "wh"),
           "EXECBOX_WEBHOOKS__TIMEOUT_S": "20", "EXECBOX_WEBHOOKS__MAX_ATTEMPTS": "1"}  # fmt: skip
    key = create_key(env, "alpha")
    api_port = free_port()
    processes.spawn(f"wh-api-{api_port}", [EXECBOX, "api", "--port", str(api_port)], env)
    processes.spawn(f"wh-worker-{api_port}", [EXECBOX, "worker", "--name", f"{prefix}-w"], as_role(env, "worker"))
    url = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: answers_200(f"{url}/readyz"), 30, "the webhook test's API and its one worker")
    hole = _Hole()
    try:
        with httpx.Client(base_url=url, timeout=60, headers=auth(key)) as client:
            hooked = client.post("/v1/executions?wait=30", json={
                "language": "python", "code": "print(1)",
                "webhook": {"url": f"http://localhost:{hole.port}/never", "secret": SECRET}}).json()  # fmt: skip
            assert hooked["status"] == "succeeded", hooked
            assert hole.opened.wait(20), "the delivery never connected"
            behind = [run_code(client, "print(2)") for _ in range(4)]
            assert [b["status"] for b in behind] == ["succeeded"] * 4, behind
            assert not hole.closed.is_set(), "the executions finished only after the delivery gave up"

            def attempts() -> list[dict[str, Any]]:
                found: list[dict[str, Any]] = client.get(f"/v1/executions/{hooked['id']}").json()["webhook_deliveries"]
                return found

            wait_until(attempts, 60, "the one attempt to time out")
            deliveries = attempts()
            assert len(deliveries) == 1 and "Timeout" in (deliveries[0]["error"] or ""), deliveries
            assert hole.closed.is_set()
    finally:
        hole.sock.close()
