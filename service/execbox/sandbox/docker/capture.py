"""Reading a run's output from the engine's attach stream, and feeding its stdin."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from docker.utils.socket import frames_iter

from execbox.sandbox.protocol import MARKER_TAIL_MAX, read_marker

STDOUT, STDERR = 1, 2


class Capture:
    """Reads the multiplexed attach stream in its own thread: byte caps per stream, and the
    launcher's end-of-run marker at the end of stdout and of stderr. The engine copies the two
    streams independently, so the run's output is complete only when both markers have arrived."""

    def __init__(
        self, cap: int, marker: bytes, wake: threading.Event, on_output: Callable[[int, bytes], None] | None = None
    ) -> None:
        self.cap = cap
        self.marker = marker
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.total = {STDOUT: 0, STDERR: 0}
        self.marked = {STDOUT: False, STDERR: False}
        self.overflowed = False
        self.produced = True
        self.exit_code: int | None = None
        self.fault: str | None = None
        self.oom = False
        self.peak: int | None = None
        self.eof = False
        self._slack = len(marker) + MARKER_TAIL_MAX  # a stream may exceed its cap by the marker
        self._tail = {STDOUT: b"", STDERR: b""}
        self._wake = wake
        self._on_output = on_output
        self._held = {STDOUT: b"", STDERR: b""}
        """Output not yet told to on_output: it may be the start of the end-of-run marker."""

    @property
    def done(self) -> bool:
        return self.marked[STDOUT] and self.marked[STDERR]

    def pump(self, sock: Any) -> None:
        try:
            for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
                if stream in self.kept:
                    self.take(stream, data)
        except (OSError, ValueError):
            pass  # the container went away, or the run is over and the stream closed; what was read is kept
        self.eof = True
        self._wake.set()

    def take(self, stream: int, data: bytes) -> None:
        """One frame of the attach stream (pump calls this; a test may too)."""
        if self._on_output is not None and not self.marked[stream]:
            self._tell(stream, data)
        self.total[stream] += len(data)
        room = self.cap + self._slack - len(self.kept[stream])
        self.kept[stream] += data[: max(room, 0)]
        if not self.marked[stream]:
            self._tail[stream] = (self._tail[stream] + data)[-self._slack :]
            if self._tail[stream].endswith(b"\x00") and self._found_marker(stream):
                if self.done:
                    self._wake.set()
                return
        if self.total[stream] > self.cap + self._slack and not self.overflowed:
            self.overflowed = True
            self._wake.set()

    def _tell(self, stream: int, data: bytes) -> None:
        """Pass output on as it arrives, holding back only what could be the marker's beginning."""
        assert self._on_output is not None
        buffer = self._held[stream] + data
        start = buffer.find(self.marker)
        if start < 0:
            start = len(buffer)
            for size in range(min(len(self.marker), len(buffer)), 0, -1):
                if buffer.endswith(self.marker[:size]):
                    start = len(buffer) - size
                    break
        out, self._held[stream] = buffer[:start], buffer[start:]
        if out:
            self._on_output(stream, out)

    def flush_held(self) -> None:
        """The run ended without a marker on a stream: what was held back was the program's."""
        for stream in (STDOUT, STDERR):
            if self._on_output is not None and not self.marked[stream] and self._held[stream]:
                self._on_output(stream, self._held[stream])
            self._held[stream] = b""

    def _found_marker(self, stream: int) -> bool:
        tail = self._tail[stream]
        report = read_marker(tail, self.marker)
        if report is None:
            return False
        self.marked[stream] = True
        self.produced, self.oom, self.peak = report.produced, report.oom, report.peak
        self.exit_code, self.fault = report.exit_code, report.fault
        size = len(tail) - report.start
        self.total[stream] -= size
        if self.kept[stream].endswith(tail[report.start :]):
            del self.kept[stream][-size:]
        return True

    def result(self, stream: int) -> tuple[bytes, int, bool]:
        total = self.total[stream]
        return bytes(self.kept[stream][: self.cap]), total, total > self.cap


def feed(raw: socket.socket, data: bytes) -> None:
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the program ended (or was killed) before reading everything


def close(sock: Any) -> None:
    """Close the attach stream: shut the socket down first, which wakes the reader thread still
    blocked in recv (close() alone would not, and the engine keeps the stream open), then close the
    file wrapper docker-py returns and the socket under it."""
    raw = getattr(sock, "_sock", sock)
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the engine
    for part in (sock, raw):
        try:
            part.close()
        except OSError:
            pass
