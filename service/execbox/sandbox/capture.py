"""Reading a run's output, whichever runtime delivers it: caps and the launcher's end-of-run marker."""

from __future__ import annotations

import threading
from collections.abc import Callable

from execbox.sandbox.protocol import MARKER_TAIL_MAX, read_marker

STDOUT, STDERR = 1, 2


class Capture:
    """A run's two output streams as they arrive (from the engine's attach stream, or the bubblewrap
    helper's frames): byte caps per stream, and the launcher's end-of-run marker at the end of
    stdout and of stderr. The two streams are copied independently, so the run's output is complete
    only when both markers have arrived."""

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

    def take(self, stream: int, data: bytes) -> None:
        """One piece of one stream (a runtime's reader calls this; a test may too)."""
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


__all__ = ["STDERR", "STDOUT", "Capture"]
