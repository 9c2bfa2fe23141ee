"""Webhooks on a real worker process: a delivery that hangs on a receiver never delays the
executions behind it. Signing, retries, the allowlist and the take-over of a dead worker's
delivery are tested on the in-process stack: tests/unit/test_webhooks_in_process.py."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import (
    EXECBOX,
    Processes,
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
    """A deployment of its own with one worker, whose deliveries wait 10 s for an answer: while that
    worker's delivery hangs on a receiver that never answers, the same worker runs the executions
    behind it (if a delivery held the thread that runs executions, none could finish before the
    hanging request is given up)."""
    port, prefix = free_port(), f"{stack.prefix}wh"
    start_redis(processes, port, tmp_path, prefix)
    env = {**deployment_env(stack, port, prefix, "wh"),
           "EXECBOX_WEBHOOKS__TIMEOUT_S": "10", "EXECBOX_WEBHOOKS__MAX_ATTEMPTS": "1"}  # fmt: skip
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
