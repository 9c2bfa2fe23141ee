"""Side effects of single executions on the real stack, end to end: a real program writing to the ledger
behind the egress allowlist with its key, its real worker SIGKILLed mid-write; and the key read by
each language's own helper, in a fresh sandbox and in a session's contexts. The orchestration of
effects (approvals, a lost worker's unkeyed write and reconcile, unknown outcomes said from inside,
status reads, refused declarations) runs in process: tests/unit/test_effects_in_process.py."""

from __future__ import annotations

import os
import secrets
import signal
import time
from typing import Any

import httpx
import pytest

from tests.conftest import Side, wait_until
from tests.integration.conftest import Targets

pytestmark = [pytest.mark.docker, pytest.mark.redis]

NET = {"name": "net", "timeout_s": 30, "network": {"mode": "allowlist", "allow": ["target-ledger:8080"]}}
WRITE = """
import execbox, json, time, urllib.request
key = execbox.idempotency_key()
request = urllib.request.Request("http://target-ledger:8080/apply", data=b"{}", method="POST",
                                 headers={"Idempotency-Key": key})
answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
if answer["applied"] and execbox.inputs.get("hold"):
    time.sleep(120)  # the first write holds here: the test kills this worker
execbox.emit("applied", answer["applied"])
"""


def key() -> str:
    return f"refund-{secrets.token_hex(6)}"


def entries(targets: Targets, for_key: str) -> list[bool]:
    return [e["applied"] for e in targets.ledger() if e["key"] == for_key]


def finished(client: httpx.Client, execution_id: str, within_s: float = 180) -> dict[str, Any]:
    """The execution once it stops (waiting on the server, a long poll at a time)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found: dict[str, Any] = client.get(f"/v1/executions/{execution_id}", params={"wait": 30}).json()
        if found["status"] not in ("queued", "running", "awaiting_approval"):
            return found
    raise AssertionError(f"execution {execution_id} did not end within {within_s} s")


def write(client: httpx.Client, strategy: str, inputs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    idempotency: dict[str, Any] = {"strategy": strategy, **fields.pop("idempotency", {})}
    body = {"language": "python", "code": WRITE, "policy": NET, "inputs": inputs, "effect": "write",
            "idempotency": idempotency, **fields}  # fmt: skip
    response = client.post("/v1/executions", json=body)
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


def kill_mid_write(side: Side, targets: Targets, ledger_key: str, create: Any) -> str:
    """Start the write on a worker of its own, wait for the ledger to see it, start a second worker
    (its reaper settles the first's attempt) and SIGKILL the first; the execution's id."""
    first = side.worker(f"fx-{ledger_key}-1")
    execution_id: str = create()["id"]
    wait_until(lambda: entries(targets, ledger_key), 60, "the write to reach the ledger")
    side.worker(f"fx-{ledger_key}-2")
    os.killpg(first.pid, signal.SIGKILL)
    return execution_id


def test_a_keyed_write_whose_worker_dies_runs_again_with_its_key_and_is_applied_once(
    ledger_side: Side, targets: Targets
) -> None:
    refund = key()
    with ledger_side.client() as client:
        create = lambda: write(client, "key", {"hold": True}, idempotency={"key": refund})  # noqa: E731
        done = finished(client, kill_mid_write(ledger_side, targets, refund, create))
    assert done["status"] == "succeeded", done["error"]["message"]
    assert done["code_runs"] == 2 and done["outputs"] == {"applied": False}
    assert entries(targets, refund) == [True, False], "the same key twice: applied once"


KEY_READERS = {
    "python": ("python", None, "import execbox\nprint(execbox.idempotency_key())"),
    "javascript": ("javascript", None, "console.log(require('execbox').idempotencyKey())"),
    "bash": ("bash", None, 'echo "$EXECBOX_IDEMPOTENCY_KEY"'),
    "session-python": ("python", "python", "import execbox\nprint(execbox.idempotency_key())"),
    "session-javascript": ("python", "javascript", "console.log(require('execbox').idempotencyKey())"),
    "session-bash": ("python", "bash", 'echo "$EXECBOX_IDEMPOTENCY_KEY"'),
}


@pytest.mark.parametrize("reader", list(KEY_READERS))
def test_the_idempotency_key_reaches_the_code_in_every_language_and_session_context(
    api: httpx.Client, reader: str
) -> None:
    language, context, code = KEY_READERS[reader]
    session = None
    if context is not None:
        session = api.post("/v1/sessions", json={"language": language}).json()["id"]
    try:
        seen = []
        for declared, header in ((key(), None), (None, key())):
            body: dict[str, Any] = {"language": language, "code": code, "effect": "read"}
            if declared:
                body = {**body, "effect": "write", "idempotency": {"strategy": "key", "key": declared}}
            if session:
                body = {**body, "session": session, "session_context": context}
            headers = {"Idempotency-Key": header} if header else {}
            done = api.post("/v1/executions", json=body, headers=headers, params={"wait": 60}).json()
            assert done["status"] == "succeeded", (done["error"], done["stderr"], done["stdout"])
            seen.append((done["stdout"].strip(), declared or header))
        assert [got for got, _ in seen] == [wanted for _, wanted in seen], "each call sees its own key"
    finally:
        if session:
            api.delete(f"/v1/sessions/{session}")
