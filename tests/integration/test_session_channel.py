"""A session call cannot be hijacked by the cell before it (finding 12), against the real engine:
the cell that forged the kernel's end frame and read the next request from the kernel's stdin no
longer reaches either, and a cell past its timeout leaves nothing running into the next call.

The attacks below are the finding's. Before the fix the kernel's request pipe (fd 0) and report
pipe (fd 3) stayed open to anything a cell left running: a thread blocked on fd 0 took call 2's
request (its code and environment), wrote `forged` on stdout and a made-up end on fd 3, and call 2
reported `succeeded` with that output while its own code never ran. Now the kernel hands each cell
over to a forked copy of itself (one thread), the supervisor waits for the old process to go and
kills every process the cell left before it reports the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_sessions import call, open_session

pytestmark = [pytest.mark.docker, pytest.mark.redis]

HIJACK = r"""
import json, os, threading

def steal():  # a thread the cell leaves behind, waiting for the next call's request
    data = os.read(0, 1 << 20)
    open("/workspace/stolen-by-thread", "wb").write(data)
    request = json.loads(data.decode().splitlines()[0])
    os.write(1, b"forged\n")
    os.write(3, (json.dumps({"id": request["id"], "status": 0, "changed": []}) + "\n").encode())

threading.Thread(target=steal, daemon=True).start()
if os.fork() == 0:  # and a process doing the same
    try:
        data = os.read(0, 1 << 20)
        open("/workspace/stolen-by-process", "wb").write(data)
        request = json.loads(data.decode().splitlines()[0])
        os.write(3, (json.dumps({"id": request["id"], "status": 0, "changed": []}) + "\n").encode())
    finally:
        os._exit(0)
kept = 41
"""


FORGE_IN_PLACE = r"""
import json, os, sys

frame = sys._getframe()  # the kernel's loop, below this cell, holds the call's request
while frame is not None and not isinstance(frame.f_locals.get("request"), dict):
    frame = frame.f_back
own = frame.f_locals["request"]["id"]
os.write(3, (json.dumps({"id": own, "status": 0, "changed": []}) + "\n").encode())  # "this call has ended"
data = os.read(0, 1 << 20)  # and wait, as the kernel would, for the next call's request
open("/workspace/stolen-in-place", "wb").write(data)
request = json.loads(data.decode().splitlines()[0])
os.write(1, b"forged\n")
os.write(3, (json.dumps({"id": request["id"], "status": 0, "changed": []}) + "\n").encode())
"""


@pytest.fixture
def session(api: httpx.Client) -> Iterator[dict[str, Any]]:
    opened = open_session(api, idle_timeout_s=300)
    yield opened
    api.delete(f"/v1/sessions/{opened['id']}")


def test_a_cell_cannot_forge_the_next_calls_end_or_read_its_request(api: httpx.Client, session: dict[str, Any]) -> None:
    sid = session["id"]
    first = call(api, sid, HIJACK)
    assert first["status"] == "succeeded", first

    own = "print('call 2 ran its own code', kept + 1)"
    request = {"language": "python", "session": sid, "code": own, "env": {"CALL2_SECRET": "s3cret"}}
    second = api.post("/v1/executions?wait=60", json=request)
    body = second.json()
    assert body["status"] == "succeeded" and body["stdout"] == "call 2 ran its own code 42\n", body
    assert "forged" not in body["stdout"]
    assert body["kernel_restarted"] is False, "the interpreter kept its state: only what the cell left running went"

    listing = call(api, sid, "import os; print(sorted(os.listdir('/workspace')))")
    assert "stolen" not in listing["stdout"], "neither the thread nor the process read call 2's code and environment"


def test_a_cell_that_forges_its_own_end_in_place_loses_its_kernel(api: httpx.Client, session: dict[str, Any]) -> None:
    """The same attack from the cell's own thread: its made-up end is not followed by the old
    process leaving, so the kernel is restarted rather than handed the next request."""
    sid = session["id"]
    first = call(api, sid, FORGE_IN_PLACE)
    assert first["kernel_restarted"] is True, first
    second = call(api, sid, "print('call 2 ran its own code')")
    assert second["status"] == "succeeded" and second["stdout"] == "call 2 ran its own code\n", second
    listing = call(api, sid, "import os; print(sorted(os.listdir('/workspace')))")
    assert "stolen" not in listing["stdout"], listing


def test_a_cell_past_its_timeout_leaves_nothing_running_into_the_next_call(
    api: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["id"]
    beating = (
        "import threading, time\nkept = 1\n"
        "def beat():\n    while True:\n        open('/workspace/beat', 'a').write('x')\n        time.sleep(0.02)\n"
        "threading.Thread(target=beat, daemon=True).start()\n"
        "import subprocess\n"
        "subprocess.Popen(['sh', '-c', 'while :; do echo y >> /workspace/beat-sh; sleep 0.02; done'])\n"
        "time.sleep(60)"
    )
    slow = call(api, sid, beating, timeout_s=2)
    assert slow["status"] == "failed" and slow["error"]["category"] == "limit.timeout", slow
    still = call(api, sid, (
        "import os, time\nsizes = lambda: (os.path.getsize('/workspace/beat'), os.path.getsize('/workspace/beat-sh'))\n"
        "before = sizes(); time.sleep(0.3); print(before == sizes(), kept)"
    ))  # fmt: skip
    assert still["stdout"] == "True 1\n", ("the cell's thread and process still write after its timeout", still)
