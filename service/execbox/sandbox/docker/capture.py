"""Reading a run's output from the engine's attach stream, and feeding its stdin."""

from __future__ import annotations

import socket
from typing import Any

from docker.utils.socket import frames_iter

from execbox.sandbox.capture import STDERR, STDOUT, Capture


class AttachCapture(Capture):
    """The shared capture, read from the engine's multiplexed attach stream in its own thread."""

    def pump(self, sock: Any) -> None:
        try:
            for stream, data in frames_iter(sock, tty=False):  # type: ignore[no-untyped-call]
                if stream in self.kept:
                    self.take(stream, data)
        except (OSError, ValueError):
            pass  # the container went away, or the run is over and the stream closed; what was read is kept
        self.eof = True
        self._wake.set()


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


__all__ = ["STDERR", "STDOUT", "AttachCapture", "close", "feed"]
