"""envd's process.Process RPCs over the sandbox's processes (sandbox-images/common/session_ops.py).

Start and Connect are server streams: the start event with the pid first (the SDKs demand it),
then output as it comes, the end event, and Connect's end-of-stream. A client that leaves stops
hearing the process, never stops it, as with E2B's own envd; the timeout the client sent
(Connect-Timeout-Ms on Start) is the process's lifetime, enforced in the sandbox. Errors of a
stream travel in its end-of-stream (HTTP 200), where both SDKs read them. A pseudo-terminal (Start
with `pty`, SendInput's `pty` bytes, Update's size) is the sandbox's own. StreamInput, a client
stream, is read as it arrives, each chunk sent on as SendInput sends one.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from typing import Any

from anyio import CancelScope

from execbox.core.errors import FieldProblem, InvalidRequest, ServiceError
from execbox.e2b.connect import connect_code, end_stream, envelope, envelopes
from execbox.e2b.envd import HOME, Envd, e2b_path, sandbox_path
from execbox.e2b.errors import NotOffered, PathNotFound
from execbox.e2b.sandboxes import Opened, sandbox_id
from execbox.executions.schemas import check_env

SIGNALS = {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM", 9: "SIGKILL", 15: "SIGTERM"}
NUMBER = re.compile(r"[0-9]{1,12}")
"""A pid or a timeout in milliseconds: ASCII digits only (str.isdigit takes '²', which int() does not)."""
KEEPALIVE_QUIETS = 30
"""Quiet seconds before a keepalive event (E2B's SDK asks for one each 50 s)."""
STREAM_INPUT_MAX = 2 << 20
"""The largest message of a StreamInput (its base64 data: the sandbox takes 1 MiB at a time)."""
STREAMS: dict[object, str] = {1: "stdout", 2: "stderr", 3: "pty"}
"""The sandbox's fd of a process's output -> the data field it goes out in."""
SIGNAL_WORDS = {"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup"}


def _bad(field: str, why: str) -> InvalidRequest:
    return InvalidRequest(why, (FieldProblem(field, why),))


async def _pid(envd: Envd, opened: Opened, body: dict[str, Any]) -> int:
    """The process a selector ({"pid"} or {"tag"}) names."""
    selector = body.get("process")
    if not isinstance(selector, dict):
        raise _bad("process", 'a process selector: {"pid": n} or {"tag": name}')
    if "pid" in selector:
        pid = selector["pid"]
        if not isinstance(pid, int | str) or not NUMBER.fullmatch(str(pid)):
            raise _bad("process.pid", "a process id (number)")
        return int(pid)
    tag = selector.get("tag")
    if not isinstance(tag, str):
        raise _bad("process", 'a process selector: {"pid": n} or {"tag": name}')
    ok, _ = await envd.ask(opened, {"op": "proc.list"})
    for proc in ok.get("processes") or []:
        if isinstance(proc, dict) and proc.get("tag") == tag:
            return int(proc["pid"])
    raise PathNotFound(f"no running process tagged {tag[:64]!r}")


async def rpc(envd: Envd, opened: Opened, method: str, body: dict[str, Any]) -> dict[str, Any]:
    """One unary process.Process call."""
    if method == "List":
        ok, _ = await envd.ask(opened, {"op": "proc.list"})
        return {"processes": [_listed(p) for p in ok.get("processes") or [] if isinstance(p, dict)]}
    if method == "SendSignal":
        named = body.get("signal")
        sig = SIGNALS.get(named) if isinstance(named, str | int) else None
        if sig is None:
            raise _bad("signal", "SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        await envd.ask(opened, {"op": "proc.signal", "pid": await _pid(envd, opened, body), "sig": sig})
        return {}
    if method == "SendInput":
        given: dict[str, Any] = body["input"] if isinstance(body.get("input"), dict) else {}
        kind = "pty" if "pty" in given else "stdin"
        data = given.get(kind)
        if not isinstance(data, str):
            raise _bad("input", 'the bytes to send: {"stdin": base64} or {"pty": base64}')
        try:
            raw = base64.b64decode(
                data + "=" * (-len(data) % 4), altchars=b"-_" if "-" in data or "_" in data else None
            )
        except ValueError:
            raise _bad(f"input.{kind}", "base64 bytes") from None
        pid = await _pid(envd, opened, body)
        await envd.ask(opened, {"op": "proc.input", "pid": pid, "b": base64.b64encode(raw).decode()})
        return {}
    if method == "CloseStdin":
        await envd.ask(opened, {"op": "proc.close", "pid": await _pid(envd, opened, body)})
        return {}
    if method == "Update":
        rows, cols = _size(body.get("pty"), "pty.size")
        await envd.ask(opened, {"op": "proc.resize", "pid": await _pid(envd, opened, body), "rows": rows, "cols": cols})
        return {}
    raise NotOffered(f"process.Process/{method[:64]} is not offered")


def _size(pty: object, field: str) -> tuple[int, int]:
    """A PTY message's size (proto3 JSON may send numbers as strings)."""
    size = pty.get("size") if isinstance(pty, dict) else None
    size = size if isinstance(size, dict) else {}
    rows, cols = size.get("rows"), size.get("cols")
    if not all(isinstance(n, int | str) and NUMBER.fullmatch(str(n)) and 1 <= int(n) <= 4096 for n in (rows, cols)):
        raise _bad(field, "rows and cols from 1 to 4096")
    return int(str(rows)), int(str(cols))


async def stream_input(envd: Envd, opened: Opened, chunks: AsyncIterator[bytes]) -> bytes:
    """StreamInput (a client stream): the start event names the process, each data event is sent to
    it as SendInput's would be, in order; the answer is one empty message and the end of stream."""
    try:
        pid = None
        async for event in envelopes(chunks, STREAM_INPUT_MAX):
            given: dict[str, Any] = event  # proto3 JSON: the oneof's field is the message's own
            if "start" in given:
                start = given["start"] if isinstance(given["start"], dict) else {}
                pid = await _pid(envd, opened, start)
            elif "data" in given:
                if pid is None:
                    raise _bad("event", "the start event (naming the process) comes first")
                data = given["data"] if isinstance(given["data"], dict) else {}
                await rpc(envd, opened, "SendInput", {"process": {"pid": pid}, "input": data.get("input")})
            elif "keepalive" not in given:
                raise _bad("event", "start, data or keepalive")
        return envelope({}) + end_stream()
    except ServiceError as exc:
        return end_stream(connect_code(exc.http_status), exc.message)


def _listed(proc: dict[str, Any]) -> dict[str, Any]:
    argv = [str(a) for a in proc.get("argv") or []] or [""]
    listed: dict[str, Any] = {
        "pid": int(proc.get("pid") or 0),
        "config": {
            "cmd": argv[0],
            "args": argv[1:],
            "envs": proc.get("env") or {},
            "cwd": e2b_path(str(proc.get("cwd"))),
        },
    }
    if proc.get("tag"):
        listed["tag"] = str(proc["tag"])
    return listed


def start_request(body: dict[str, Any], timeout_ms: str | None) -> dict[str, Any]:
    """A Start message as the sandbox's proc.start (checked: a bad one fails before any stream)."""
    process = body.get("process")
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str) or not process["cmd"]:
        raise _bad("process.cmd", "the program to run")
    args = process.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) and "\x00" not in a for a in args) or len(args) > 4096:
        raise _bad("process.args", "a list of strings without NUL")
    envs = process.get("envs") or {}
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()) or len(envs) > 64:
        raise _bad("process.envs", "at most 64 names, each mapped to a string")
    try:
        check_env(envs)
    except ValueError as exc:
        raise _bad("process.envs", str(exc)) from None
    tag = body.get("tag")
    if tag is not None and (not isinstance(tag, str) or len(tag) > 256):
        raise _bad("tag", "a string of at most 256 characters")
    timeout_s = None
    if timeout_ms:
        if not NUMBER.fullmatch(timeout_ms):
            raise _bad("Connect-Timeout-Ms", "milliseconds")
        timeout_s = int(timeout_ms) / 1000 or None
    cwd = process.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _bad("process.cwd", "a directory (string)")
    pty = {}
    if body.get("pty") is not None:
        rows, cols = _size(body.get("pty"), "pty.size")
        pty = {"pty": {"rows": rows, "cols": cols}}
    return {
        **pty,
        "op": "proc.start",
        "argv": [process["cmd"], *args],
        "env": envs,
        "cwd": e2b_path(sandbox_path(cwd, "process.cwd")) if cwd else HOME,  # as the client says it: pwd shows it so
        "stdin": bool(body.get("stdin")),
        "tag": tag,
        "timeout_s": timeout_s,
    }


async def stream(
    envd: Envd, opened: Opened, method: str, body: dict[str, Any], timeout_ms: str | None
) -> AsyncIterator[bytes]:
    """Start or Connect as Connect envelopes, errors included."""
    op = None
    ended = False
    try:
        if method == "Start":
            op = await envd.send(opened, start_request(body, timeout_ms))
        elif method == "Connect":
            op = await envd.send(opened, {"op": "proc.watch", "pid": await _pid(envd, opened, body)})
        else:
            raise NotOffered(f"process.Process/{method[:64]} is not offered")
        quiet = 0
        async for answer in envd.follow(opened, op):
            kind = answer.get("ev")
            if kind == "reply":
                pid = envd.reply(answer).get("pid")
                yield envelope({"event": {"start": {"pid": pid}}})
            elif kind == "pout":
                quiet = 0
                stream_name = STREAMS.get(answer.get("fd"), "stderr")
                yield envelope({"event": {"data": {stream_name: answer.get("b", "")}}})
            elif kind == "pend":
                ended = True
                yield envelope({"event": {"end": _end(answer)}})
                yield end_stream()
                return
            elif kind == "quiet":
                quiet += 1
                if quiet >= KEEPALIVE_QUIETS:
                    quiet = 0
                    yield envelope({"event": {"keepalive": {}}})
        ended = True
        yield end_stream("unavailable", f"The sandbox {sandbox_id(opened.session.id)} was not found: it ended")
    except ServiceError as exc:
        ended = True
        yield end_stream(connect_code(exc.http_status), exc.message)
    finally:
        if op is not None and not ended:
            with CancelScope(shield=True):
                await envd.unwatch(opened, op)


def _end(answer: dict[str, Any]) -> dict[str, Any]:
    """A process's end as envd reports it (Go's ProcessState: -1 and "signal: killed" when killed)."""
    signal = answer.get("signal")
    if isinstance(signal, str):
        status = f"signal: {SIGNAL_WORDS.get(signal, signal)}"
        return {"exitCode": -1, "exited": False, "status": status, "error": status}
    code = answer.get("status")
    code = code if isinstance(code, int) else -1
    status = f"exit status {code}"
    return {"exitCode": code, "exited": True, "status": status, **({"error": status} if code else {})}


__all__ = ["rpc", "start_request", "stream", "stream_input"]
