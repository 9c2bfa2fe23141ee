"""KernelContainer: a session's container, its kernel's supervisor, and one call at a time.

The container is made with the same hardening as any run (DockerRuntime._create); its program is
the language's session supervisor (sandbox-images/common/session.py, which documents the JSON
lines spoken on the attach stream). The attach stream stays open for the session's life: requests
go down stdin, events come up stdout. Everything read from it is the sandbox's word: parsed
defensively, capped, and never trusted with the clock; the worker's own deadline ends a call that
the supervisor does not end, and a supervisor that does not answer an interrupt loses the session.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import queue
import secrets
import select
import socket
import ssl
import tarfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import docker
from docker.utils.socket import frames_iter

from execbox.sandbox.docker.capture import STDERR, STDOUT, close
from execbox.sandbox.docker.engine import docker_errors
from execbox.sandbox.errors import RuntimeUnavailable
from execbox.sandbox.protocol import frame_files
from execbox.sandbox.runtime import SESSION_LABEL, WORKDIR, SandboxControl, SandboxOutcome, SandboxSpec

log = logging.getLogger(__name__)
INTERRUPT_GRACE_S = 20.0
"""After an interrupt: the supervisor's own grace (2 s) plus a kernel restart, with room."""
LINE_CAP = 1 << 20
"""The longest event line read from the supervisor (its output chunks are 64 KiB before base64,
a file's 512 KiB)."""
SIDE_EVENTS = frozenset({"reply", "chunk", "pout", "pend", "wev"})
"""What the supervisor says outside a cell (session_ops.py): for the listener, not the call."""
SEND_TIMEOUT_S = 75.0
"""The longest a file or process request may wait for the sandbox to take it (its stdin full: a
supervisor that stopped reading, say one its own code sent SIGSTOP). The supervisor may rightly not
read for a while: a kernel restart waits up to 60 s for the new kernel. Past it the session is
lost, so no thread of the worker ever waits on the sandbox without a bound (control C51)."""
CELL_SEND_TIMEOUT_S = 15.0
"""The same for a cell's own requests (run, interrupt): they are sent while the supervisor reads
(idle, or relaying the cell), so a shorter wait, and the cell's timeout is not outlived by much."""


class KernelHost(Protocol):
    """What a session needs of execbox.sandbox.docker.runtime.DockerRuntime."""

    @property
    def api(self) -> docker.APIClient: ...

    def image_id(self, image: str) -> str: ...

    def labels(self, spec: SandboxSpec, extra: dict[str, str]) -> dict[str, str]: ...

    def create_labelled(self, spec: SandboxSpec, labels: dict[str, str]) -> str: ...

    def collect(self, cid: str, spec: SandboxSpec) -> str | None: ...

    def remove(self, container_id: str) -> None: ...


class KernelContainer:
    def __init__(self, runtime: KernelHost, spec: SandboxSpec, session_id: str) -> None:
        self._runtime = runtime
        self._spec = spec
        self.session_id = session_id
        self.container_id: str | None = None
        self.gone: str | None = None
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cell: str | None = None
        """The cell running now: output said when none runs is no call's, and is not kept."""
        self._sock: Any = None
        self._raw: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._listener: Callable[[dict[str, Any]], None] | None = None
        self.image_id = ""

    # opening
    def open(self, start_timeout_s: float) -> None:
        runtime, spec = self._runtime, self._spec
        self.image_id = runtime.image_id(spec.image)
        labels = runtime.labels(spec, {SESSION_LABEL: self.session_id})
        with docker_errors():
            self.container_id = runtime.create_labelled(spec, labels)
            api = runtime.api
            self._sock = api.attach_socket(
                self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._raw = getattr(self._sock, "_sock", self._sock)
            threading.Thread(target=self._read, name=f"session-{self.session_id}", daemon=True).start()
            api.start(self.container_id)
            if spec.input_archive:
                api.put_archive(self.container_id, WORKDIR, spec.input_archive)
        nonce = secrets.token_hex(8)  # the launcher's: a fault of its own before the exec carries it
        self._send(frame_files((), nonce, spec.env, become=True))  # the supervisor is PID 1
        deadline = time.monotonic() + start_timeout_s
        while True:
            event = self._next(deadline)
            if event is None or event.get("ev") == "gone":
                self.gone = self.gone or "the session's kernel did not start"
                raise RuntimeUnavailable(f"{self.gone}; retry")
            if event.get("ev") == "ready":
                return

    def _read(self) -> None:
        """Turn the attach stream into events; the supervisor's lines are on stdout only."""
        pending = bytearray()
        errors = bytearray()
        try:
            for stream, data in frames_iter(self._sock, tty=False):  # type: ignore[no-untyped-call]
                if stream == STDERR:
                    errors += data
                    del errors[:-4096]
                    continue
                if stream != STDOUT:
                    continue
                pending += data
                while (end := pending.find(b"\n")) >= 0:
                    line = bytes(pending[:end])
                    del pending[: end + 1]
                    if b"\x00" in line:  # the launcher's marker: it failed before it became the supervisor
                        raise EOFError
                    self._parse(line)
                if len(pending) > LINE_CAP:
                    self.gone = "the session's supervisor sent an oversized line; the session was closed"
                    break
        except (OSError, ValueError, EOFError):
            pass
        tail = bytes(errors).split(b"\x00")[0].decode("utf-8", "replace").strip()[-500:]
        self.gone = self.gone or "the session's sandbox ended" + (f" ({tail})" if tail else "")
        self._events.put({"ev": "gone"})

    def _parse(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            log.warning("session %s: unreadable line from the supervisor", self.session_id)
            return
        if not isinstance(event, dict):
            return
        if event.get("ev") == "out" and self._cell is None:
            return  # between cells: not queued, so that a sandbox that floods then cannot grow this process
        if event.get("ev") in SIDE_EVENTS:
            listener = self._listener
            if listener is not None:
                try:
                    listener(event)
                except Exception:  # what the sandbox says must never stop this thread from reading it
                    log.exception("session %s: an event beside the cells could not be handled", self.session_id)
            return
        self._events.put(event)

    def _next(self, deadline: float) -> dict[str, Any] | None:
        try:
            return self._events.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            return None

    def _send(self, data: bytes, timeout_s: float | None = None) -> None:
        """Write a request within timeout_s (default SEND_TIMEOUT_S; the lock's wait counted), or
        lose the session.

        The socket is also the reader's, so it stays blocking: each write is MSG_DONTWAIT after a
        poll for room, and the reader's recv is not given a timeout it would take for an end."""
        timeout_s = SEND_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        if self.gone is not None or not self._send_lock.acquire(timeout=timeout_s):
            self.gone = self.gone or self._stalled(timeout_s)
            return
        try:
            view = memoryview(data)
            while view and self.gone is None:
                assert self._raw is not None
                left = deadline - time.monotonic()
                if left <= 0 or not _writable(self._raw, left):
                    self.gone = self.gone or self._stalled(timeout_s)
                    return
                try:
                    if isinstance(self._raw, ssl.SSLSocket):  # no flags there: a small piece, once there is room
                        view = view[self._raw.send(view[:4096]) :]
                    else:
                        view = view[self._raw.send(view, socket.MSG_DONTWAIT) :]
                except (BlockingIOError, ssl.SSLWantWriteError):
                    continue
        except (OSError, ValueError, AssertionError) as exc:
            self.gone = self.gone or f"the session's sandbox stopped reading ({exc})"
        finally:
            self._send_lock.release()

    @staticmethod
    def _stalled(timeout_s: float) -> str:
        return (
            f"the session's supervisor took no request for {timeout_s:.0f} s (stopped, or its input "
            "full); the session was closed"
        )

    def _request(self, request: dict[str, Any], timeout_s: float | None = None) -> None:
        self._send((json.dumps(request) + "\n").encode(), timeout_s)

    # beside the cells
    def op(self, request: dict[str, Any]) -> None:
        if request.get("op") in ("run", "interrupt"):
            raise ValueError("cells are run with run_cell")
        self._request(request)

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self._listener = listener

    # one call
    def run_cell(self, spec: SandboxSpec, code: str, control: SandboxControl) -> SandboxOutcome:
        t0 = time.monotonic()
        assert self.container_id is not None
        cell = spec.execution_id
        with docker_errors():
            archive = _tar(spec.files)
            if archive:
                self._runtime.api.put_archive(self.container_id, WORKDIR, archive)
            if spec.input_archive:
                self._runtime.api.put_archive(self.container_id, WORKDIR, spec.input_archive)
        while not self._events.empty():  # anything left from before this call is not this call's
            self._events.get_nowait()
        started = time.monotonic()
        request = {"op": "run", "id": cell, "code": code, "env": dict(spec.env), "context": spec.session_context}
        self._cell = cell
        try:
            return self._run(spec, cell, control, request, t0, started)
        finally:
            self._cell = None

    def _run(
        self, spec: SandboxSpec, cell: str, control: SandboxControl, request: dict[str, Any], t0: float, started: float
    ) -> SandboxOutcome:
        kept = {STDOUT: bytearray(), STDERR: bytearray()}
        totals = {STDOUT: 0, STDERR: 0}
        cap = spec.limits.output_bytes
        interrupted: list[str] = []

        def interrupt(why: str) -> None:
            if not interrupted:
                interrupted.append(why)
                self._request({"op": "interrupt", "id": cell}, CELL_SEND_TIMEOUT_S)

        self._request(request, CELL_SEND_TIMEOUT_S)
        control.set_killer(lambda: interrupt("cancelled"))
        deadline = started + spec.limits.timeout_s
        end: dict[str, Any] | None = None
        while end is None and self.gone is None:
            event = self._next(deadline)
            if event is None:
                if interrupted:  # interrupted and still no end: the supervisor does not answer
                    self.gone = "the session's kernel did not stop when interrupted; the session was closed"
                    break
                interrupt("timeout")
                deadline = time.monotonic() + INTERRUPT_GRACE_S
                continue
            kind = event.get("ev")
            if kind == "out" and event.get("fd") in (STDOUT, STDERR):
                try:
                    data = base64.b64decode(str(event.get("b", "")))
                except ValueError:
                    continue
                fd = int(event["fd"])
                totals[fd] += len(data)
                kept[fd] += data[: max(cap - len(kept[fd]), 0)]
                if spec.on_output is not None:
                    spec.on_output(fd, data)
                if totals[fd] > cap:
                    interrupt("output")
            elif kind == "end" and event.get("id") == cell:
                end = event
        ended = time.monotonic()
        end = end or {}
        collect_error = None
        changed = frozenset(p for p in end.get("changed", []) if isinstance(p, str))
        if spec.collector is not None and self.gone is None:
            collect_error = self._collect(spec, changed)
        status = end.get("status")
        return SandboxOutcome(
            exit_code=int(status) if isinstance(status, int) else None,
            stdout=bytes(kept[STDOUT]),
            stderr=bytes(kept[STDERR]),
            stdout_total=totals[STDOUT],
            stderr_total=totals[STDERR],
            stdout_truncated=totals[STDOUT] > cap,
            stderr_truncated=totals[STDERR] > cap,
            timed_out="timeout" in interrupted,
            cancelled=control.cancelled,
            oom_killed=bool(end.get("oom")),
            peak_memory_bytes=int(end["peak"]) if isinstance(end.get("peak"), int) and end["peak"] else None,
            image_id=self.image_id,
            start_ms=(started - t0) * 1000,
            run_ms=(ended - started) * 1000,
            collect_ms=(time.monotonic() - ended) * 1000,
            collect_error=collect_error,
            warm=True,
            launcher_fault=self.gone,
            kernel_restarted=bool(end.get("restarted")) or self.gone is not None,
            session_note=str(end["reason"]) if end.get("reason") else None,
        )

    def _collect(self, spec: SandboxSpec, changed: frozenset[str]) -> str | None:
        assert spec.collector is not None and self.container_id is not None
        spec.collector.only = changed  # only this call's files are its artifacts
        return self._runtime.collect(self.container_id, spec)

    def close(self) -> None:
        if self._sock is not None:
            close(self._sock)
        if self.container_id is not None:
            self._runtime.remove(self.container_id)


def _writable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether sock has room to write within timeout_s (poll: a worker's fds may pass 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(timeout_s * 1000))


def _tar(files: tuple[tuple[str, bytes], ...]) -> bytes:
    """A call's service files (inputs.json), owned by root and read-only to the program."""
    if not files:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
