"""The worker's half of the bubblewrap runtime (execbox.sandbox.bwrap.runtime) against a fake helper
on a real unix socket: what the worker makes of a helper that stops mid-run, of a launcher the OOM
killer ended, and how much stdin it sends ahead of the helper's credit. No root, no bwrap, no Docker."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execbox.executions.classify import classify
from execbox.sandbox.bwrap import wire
from execbox.sandbox.bwrap.runtime import BwrapRuntime
from execbox.sandbox.runtime import Limits, SandboxControl, SandboxOutcome, SandboxSpec
from execbox.sandbox.uids import LocalUids

LIMITS = Limits(timeout_s=10, cpu=1.0, cpu_time_s=10, memory_mb=64, pids=16, disk_mb=16, output_bytes=1 << 16)
Script = Callable[[socket.socket], None]


class _Uids(LocalUids):
    def __init__(self) -> None:
        super().__init__("200000-200009")
        self.released: list[int] = []

    def release(self, uid: int) -> None:
        self.released.append(uid)
        super().release(uid)


@pytest.fixture
def fake_helper(tmp_path: Path) -> Iterator[Callable[[Script], str]]:
    """A helper socket whose one connection `script` answers (after it read the HEAD)."""
    servers: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(script: Script) -> str:
        path = str(tmp_path / f"h{len(servers)}.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        servers.append(server)

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                frame = wire.read(conn)
                assert frame is not None and frame[0] == wire.HEAD
                script(conn)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for server in servers:
        server.close()
    for thread in threads:
        thread.join(5)


def run(path: str, uids: _Uids, stdin: bytes = b"") -> SandboxOutcome:
    spec = SandboxSpec(execution_id="exe_fake", trace_id="", worker="w", image="python", command=("python3",),
                       files=(("main.py", b"print(1)"),), env=(), limits=LIMITS, stdin=stdin)  # fmt: skip
    return BwrapRuntime(path, uids, lambda image: "sha256:" + "0" * 64).run(spec, SandboxControl())


def started(conn: socket.socket) -> None:
    conn.sendall(wire.pack_json(wire.EXIT, {"event": "started"}))


def test_a_helper_that_stops_mid_run_is_a_retryable_sandbox_error_not_the_programs_exit(
    fake_helper: Callable[[Script], str],
) -> None:
    """The helper stopped (SIGTERM, or killed) with the run alive: its connection just closed, and the
    worker read that as the program's end: `code.exit_nonzero`, "exit code None". The program did
    nothing: the run's outcome is unknown, and retryable."""

    def stop(conn: socket.socket) -> None:
        started(conn)
        conn.shutdown(socket.SHUT_RDWR)

    uids = _Uids()
    outcome = run(fake_helper(stop), uids)
    verdict = classify(outcome, "python", LIMITS)
    assert verdict.error is not None
    assert (verdict.error.category, verdict.error.retryable) == ("sandbox.error", True), verdict.error
    assert "closed the connection before the run ended" in verdict.error.message
    assert uids.released == [], "a uid the helper never showed free was given back"


def test_a_helper_that_says_it_stopped_is_a_retryable_sandbox_error(fake_helper: Callable[[Script], str]) -> None:
    def stop(conn: socket.socket) -> None:
        started(conn)
        conn.sendall(wire.pack_json(wire.FAILED, {"error": "the bubblewrap helper stopped; the run was killed (retry)"})
                     + wire.pack_json(wire.EXIT, {"event": "exited", "status": -9, "oom_kills": 0})
                     + wire.pack_json(wire.EXIT, {"event": "released", "uid_free": True}))  # fmt: skip

    uids = _Uids()
    verdict = classify(run(fake_helper(stop), uids), "python", LIMITS)
    assert verdict.error is not None and verdict.error.category == "sandbox.error" and verdict.error.retryable
    assert "helper stopped" in verdict.error.message
    assert len(uids.released) == 1  # shown free: given back


def test_a_launcher_the_oom_killer_ended_is_the_memory_limit(fake_helper: Callable[[Script], str]) -> None:
    """Writing 100 MiB of files with 64 MiB of memory: the kernel's OOM killer picked the launcher,
    which then reported nothing ("init ended without reporting", a retryable sandbox.error where runc
    says limit.memory). The helper reads the run's OOM kills from its memory cgroup."""

    def oom(conn: socket.socket) -> None:
        started(conn)
        conn.sendall(wire.pack_json(wire.EXIT, {"event": "exited", "status": -9, "oom_kills": 1}))
        while (frame := wire.read(conn)) is not None and frame[0] != wire.RELEASE:
            pass
        conn.sendall(wire.pack_json(wire.EXIT, {"event": "released", "uid_free": True}))

    verdict = classify(run(fake_helper(oom), _Uids()), "python", LIMITS)
    assert verdict.error is not None and verdict.error.category == "limit.memory", verdict.error


def test_stdin_goes_no_further_than_the_helpers_credit(fake_helper: Callable[[Script], str]) -> None:
    """The worker sends at most the window ahead of what the helper credited back, so the root helper
    never holds more of a run's unread stdin than that."""
    received = [0]

    def stingy(conn: socket.socket) -> None:
        started(conn)
        conn.settimeout(2)
        try:
            while (frame := wire.read(conn)) is not None and frame[0] in (wire.STDIN, wire.STDIN_END):
                received[0] += len(frame[1])
        except (TimeoutError, wire.WireError):
            pass  # the worker waits for credit that never comes
        conn.sendall(wire.pack_json(wire.FAILED, {"error": "enough"}))

    run(fake_helper(stingy), _Uids(), stdin=b"x" * (8 << 20))
    assert wire.STDIN_WINDOW - wire.STDIN_PIECE < received[0] <= wire.STDIN_WINDOW
