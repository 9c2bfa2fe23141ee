"""BwrapRuntime: a run in fresh namespaces made by the host's bubblewrap helper, not in a container.

The worker's half of execbox.sandbox.bwrap.helper: it reserves the run's uid (from the same
allocator as the Docker runtime's, so the two never share one), sends the run, feeds the
launcher's frame (execbox.sandbox.protocol: the same launcher, nonce and end-of-run marker as in a
container), reads the output through the same Capture, and asks for the output directory when the
run is over. Input files travel in the frame (the launcher writes them as the run's uid), so no
archive is ever unpacked by root.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import queue
import secrets
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from execbox.sandbox.bwrap import wire
from execbox.sandbox.capture import STDERR, STDOUT, Capture
from execbox.sandbox.errors import RuntimeUnavailable
from execbox.sandbox.protocol import BASE_ENV, LAUNCHER, done_marker, frame_files
from execbox.sandbox.runtime import SandboxControl, SandboxOutcome, SandboxSpec
from execbox.sandbox.uids import UidAllocator

log = logging.getLogger(__name__)
NAME = "bwrap"
"""The policy's `runtime` that picks this runtime."""
COLLECT_WAIT_S = 60.0
"""Longest pause in the output directory's stream before the collection is given up."""
RELEASE_WAIT_S = 30.0
"""How long the helper may take to clean a run up and say whether its uid is free."""
START_WAIT_S = 600.0
"""How long a run may wait for the helper to start it (the first run of an image version waits
while the helper unpacks it: about 20 s for the 1.2 GB Python image here)."""


def archive_files(archive: bytes | None) -> tuple[tuple[str, bytes], ...]:
    """The regular files of an input archive, as frame files (directories follow from their paths)."""
    if not archive:
        return ()
    files = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member)
                files.append((member.name.lstrip("/"), data.read() if data else b""))
    return tuple(files)


class _Session:
    """One connection to the helper, read in a thread of its own."""

    def __init__(self, conn: socket.socket, capture: Capture, wake: threading.Event) -> None:
        self.conn, self.capture, self.wake = conn, capture, wake
        self.started = threading.Event()
        self.settled = threading.Event()
        """Set once the run started, or the helper refused it or went away before."""
        self.exited = threading.Event()
        self.released = threading.Event()
        """Set once the helper cleaned the run up (uid_free says whether its uid may be reused) or went away."""
        self.uid_free: bool | None = None
        self.status: int | None = None
        self.oom = False
        self.failure: str | None = None
        self.tar: queue.Queue[bytes | None] = queue.Queue()
        self.tar_error: str | None = None
        self.tar_taken = False
        """The collector is done: further TAR frames are dropped, not queued."""
        self.lock = threading.Lock()
        self.window = wire.STDIN_WINDOW
        self.credit = threading.Condition()
        self.closed = False

    def send(self, data: bytes) -> None:
        with self.lock:
            self.conn.sendall(data)

    def tell(self, kind: int) -> None:
        """A control frame (KILL, COLLECT, RELEASE); a helper already gone needs none."""
        with contextlib.suppress(OSError):
            self.send(wire.pack(kind))

    def read(self) -> None:
        try:
            while (frame := wire.read(self.conn)) is not None:
                kind, payload = frame
                if kind in (wire.OUT, wire.ERR):
                    self.capture.take(STDOUT if kind == wire.OUT else STDERR, payload)
                elif kind == wire.CREDIT:
                    with self.credit:
                        self.window += wire.parse_credit(payload)
                        self.credit.notify_all()
                elif kind == wire.EXIT:
                    self._event(wire.parse_json(payload, "EXIT"))
                elif kind == wire.TAR:
                    if not self.tar_taken:
                        self.tar.put(payload)
                elif kind == wire.TAR_END:
                    self.tar_error = wire.parse_json(payload, "TAR_END").get("error")
                    self.tar.put(None)
                elif kind == wire.FAILED:
                    self.failure = str(wire.parse_json(payload, "FAILED").get("error"))
                    self.wake.set()
                    if not self.started.is_set():
                        break
        except (OSError, wire.WireError) as exc:
            self.failure = self.failure or f"the connection to the bubblewrap helper broke ({exc})"
        if not (self.released.is_set() or self.exited.is_set()):
            # Not the program's doing: the helper stopped (or was killed) with the run alive.
            self.failure = self.failure or "the bubblewrap helper closed the connection before the run ended"
        with self.credit:
            self.closed = True
            self.credit.notify_all()
        self.capture.eof = True
        self.tar.put(None)
        self.exited.set()
        self.settled.set()
        self.released.set()
        self.wake.set()

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "started":
            self.started.set()
            self.settled.set()
        elif event.get("event") == "exited":
            status = event.get("status")
            self.status = 128 - status if isinstance(status, int) and status < 0 else status
            self.oom = bool(event.get("oom_kills"))
            self.capture.eof = True
            self.exited.set()
            self.wake.set()
        elif event.get("event") == "released":
            self.uid_free = event.get("uid_free") is True
            self.released.set()

    def feed(self, payload: bytes) -> None:
        """The frame and stdin, no more than the helper's window ahead of what it wrote to the program."""
        try:
            for start in range(0, len(payload), wire.STDIN_PIECE):
                piece = payload[start : start + wire.STDIN_PIECE]
                with self.credit:
                    while self.window < len(piece) and not self.closed:
                        self.credit.wait()
                    if self.closed:
                        return
                    self.window -= len(piece)
                self.send(wire.pack(wire.STDIN, piece))
            self.send(wire.pack(wire.STDIN_END))
        except OSError:
            pass  # the run is over

    def chunks(self, first_within_s: float = COLLECT_WAIT_S) -> Iterator[bytes]:
        """The TAR frames as they come; each within a bound, else the collection ends there."""
        try:
            while (chunk := self.tar.get(timeout=first_within_s)) is not None:
                yield chunk
        except queue.Empty:
            self.tar_error = f"the helper sent nothing of the output directory for {first_within_s:.0f} s"


class BwrapRuntime:
    def __init__(self, socket_path: str, uids: UidAllocator, image_id: Callable[[str], str]) -> None:
        self._socket = socket_path
        self._uids = uids
        self._image_id = image_id

    def _connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._socket)
        except OSError as exc:
            conn.close()
            raise RuntimeUnavailable(
                f"the bubblewrap helper does not answer on {self._socket} ({exc}); "
                "start it with `execbox bwrap-helper` (as root) on this host"
            ) from exc
        return conn

    def run(self, spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        if spec.egress is not None:
            raise RuntimeUnavailable("the bwrap runtime runs without a network; network allowlists need runc or runsc")
        t0 = time.monotonic()
        image_id = self._image_id(spec.image)
        uid = self._uids.reserve()
        free = [True]
        try:
            return self._run(spec, control, image_id, uid, t0, free)
        finally:
            if free[0]:
                self._uids.release(uid)
            else:  # its reservation expires on its own (UID_HOLD_S), long after the helper's sweep
                log.warning("sandbox uid %d kept reserved: the helper did not show it free", uid)

    def _run(
        self, spec: SandboxSpec, control: SandboxControl, image_id: str, uid: int, t0: float, free: list[bool]
    ) -> SandboxOutcome:
        lim = spec.limits
        nonce = secrets.token_hex(8)
        wake = threading.Event()
        capture = Capture(lim.output_bytes, done_marker(nonce), wake, spec.on_output)
        conn = self._connect()
        session = _Session(conn, capture, wake)
        try:
            head = {"image": image_id, "uid": uid, "label": spec.execution_id, "command": [*LAUNCHER, *spec.command],
                    "env": [list(p) for p in (*BASE_ENV.items(), *spec.container_env)],
                    "limits": {"cpu": lim.cpu, "cpu_time_s": lim.cpu_time_s, "memory_mb": lim.memory_mb,
                               "pids": lim.pids, "disk_mb": lim.disk_mb, "timeout_s": lim.timeout_s},
                    "collect": spec.collect_path.strip("/"), "seccomp_deny": list(spec.seccomp_deny)}  # fmt: skip
            session.send(wire.pack_json(wire.HEAD, head))
            threading.Thread(target=session.read, name=f"bwrap-{spec.execution_id}", daemon=True).start()
            files = spec.files + archive_files(spec.input_archive)
            payload = frame_files(files, nonce, spec.env) + spec.stdin
            threading.Thread(target=session.feed, args=(payload,), daemon=True).start()
            control.set_killer(wake.set)
            # Not the run's time: the helper may be unpacking the image (once per image version).
            session.settled.wait(timeout=START_WAIT_S)
            if not session.started.is_set():
                raise RuntimeUnavailable(session.failure or "the bubblewrap helper did not start the run")
            started = time.monotonic()
            wake.wait(timeout=lim.timeout_s)
            ended = time.monotonic()
            timed_out = not wake.is_set()
            stopped = capture.overflowed or control.cancelled
            finished = capture.done and not (timed_out or stopped)
            fault = capture.fault if finished else None
            collect_error: str | None = None
            if not finished:
                session.tell(wire.KILL)
            if spec.collector is not None and (not finished or fault is None) and session.failure is None:
                if capture.produced or spec.collect_path != "out" or not finished:
                    session.tell(wire.COLLECT)
                    chunks = session.chunks()
                    first = next(chunks, None)
                    if first is not None:  # else no such directory (or the connection broke): nothing to collect
                        try:
                            spec.collector(itertools.chain((first,), chunks))
                        finally:
                            session.tar_taken = True  # what the collector did not read is dropped
                    collect_error = session.tar_error
            collected_at = time.monotonic()
            if finished:
                exit_code, oom_killed = capture.exit_code, capture.oom
            else:
                session.exited.wait(timeout=10.0)
                # The launcher itself killed by the run's memory limit reports nothing: the helper
                # read the OOM kill from the run's memory cgroup.
                exit_code, oom_killed = session.status, capture.oom or session.oom
                if capture.eof and not (timed_out or stopped) and session.status is not None:
                    fault = f"the sandbox's init ended without reporting the run (exit code {exit_code})"
                capture.flush_held()
            if session.failure and not finished:
                fault = session.failure
            stdout, stdout_total, stdout_over = capture.result(STDOUT)
            stderr, stderr_total, stderr_over = capture.result(STDERR)
            return SandboxOutcome(
                exit_code=exit_code, stdout=stdout, stderr=stderr, stdout_total=stdout_total,
                stderr_total=stderr_total, stdout_truncated=stdout_over, stderr_truncated=stderr_over,
                timed_out=timed_out, cancelled=control.cancelled, oom_killed=oom_killed,
                peak_memory_bytes=capture.peak, image_id=image_id, start_ms=(started - t0) * 1000,
                run_ms=(ended - started) * 1000, collect_ms=(collected_at - ended) * 1000,
                collect_error=collect_error if spec.collector else None, launcher_status=finished and fault is None,
                launcher_fault=fault,
            )  # fmt: skip
        finally:
            session.tell(wire.RELEASE)
            if session.started.is_set():  # a run that never started held no process
                session.released.wait(timeout=RELEASE_WAIT_S)
                free[0] = session.uid_free is True
            conn.close()
