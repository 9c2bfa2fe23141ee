"""Webhooks: signed, retried with backoff, logged on the execution, only to allowed hosts."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import Side, run_code, wait_until

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
        side = side_stack(EXECBOX_WEBHOOKS__ALLOW_HOSTS='["127.0.0.1"]', EXECBOX_WEBHOOKS__BACKOFF_S="0.2")
        side.worker("hooks")
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
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
