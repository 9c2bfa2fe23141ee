"""Files and processes in a held session, beside its cells: the API asks, the holder relays.

A request is a JSON object with an op id the asker chose (`new_op`), pushed on the session's
`ses:{id}:asks`. The worker holding the session relays it to the sandbox's supervisor, which serves
it between its other work (sandbox-images/common/session_ops.py documents each request and answer),
and pushes everything said about that id on `ses:{id}:answers:{op}`: a read's chunks, then the
reply; for a process it started, also the process's output and its end. Another asker may follow a
running process (`proc.watch`, with the pid) and stop following it (`proc.unwatch`, with the op id
it watched under). A directory watcher (`watch.start`) is named by its request's op id: what the
sandbox reports of it comes on that op's answers until `watch.stop` names it. An asker that stops
reading is not waited for: its answers expire (ANSWER_TTL_S), and one that lets ANSWER_CAP of them
pile up is dropped (a last "dropped" answer). When the session ends, every open request and every
watcher gets a last "gone".

The holder (execbox.sessions.relay) trusts nothing it relays to have come from a well-behaved API: a
request that is not one of OPS with a well-formed id is set aside (logged, counted) and the relay
goes on. This module is the asker's half and imports nothing of the sandbox's.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from secrets import token_hex
from typing import Any

import redis.asyncio as aioredis

from execbox.sessions.keys import SessionKeys

ANSWER_TTL_S = 60
ANSWER_CAP = 4096
OPS = frozenset(
    {"fs", "proc.start", "proc.input", "proc.close", "proc.signal", "proc.list", "proc.watch", "proc.unwatch",
     "proc.resize", "watch.start", "watch.stop"}
)  # fmt: skip
OP_ID = re.compile(r"[0-9a-f]{24}")


def new_op() -> str:
    return token_hex(12)


async def answers(
    client: aioredis.Redis, keys: SessionKeys, session_id: str, op: str, wait_s: float
) -> AsyncIterator[dict[str, Any]]:
    """The answers to one request as they come; {"ev": "quiet"} after each wait_s without one
    (the caller checks that the session still runs, sends a keepalive, or gives up)."""
    key = keys.session_answers(session_id, op)
    while True:
        got = await client.blpop([key], timeout=wait_s)
        if got is None:
            yield {"ev": "quiet"}
            continue
        try:
            answer = json.loads(got[1])
        except ValueError:
            continue
        if isinstance(answer, dict):
            yield answer
