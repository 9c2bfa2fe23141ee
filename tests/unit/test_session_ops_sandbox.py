"""The session supervisor's file and process ops (sandbox-images/common/session_ops.py and the
session_*.py modules it is made of), run in this process on a temporary workspace: what issue 44
found answered with a 500 or a reply too long for the worker, and a command's background children
outliving its lifetime. (The same attacks against the real engine: tests/integration/test_sessions.py.)"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import wait_until

COMMON = Path(__file__).resolve().parents[2] / "sandbox-images" / "common"


@pytest.fixture
def ops_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """session_ops.py as the supervisor imports it (beside the modules it is made of), its
    workspace (session_paths.WORKDIR) a temporary directory."""
    monkeypatch.syspath_prepend(str(COMMON))
    module = importlib.import_module("session_ops")
    monkeypatch.setattr(importlib.import_module("session_paths"), "WORKDIR", str(tmp_path))
    return module


class Said:
    """What the ops emit (the supervisor's stdout), and the one reply to each request."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def reply(self, ident: str) -> dict[str, Any]:
        found = [e for e in self.events if e.get("ev") == "reply" and e.get("id") == ident]
        assert len(found) == 1, self.events
        return found[0]


@pytest.fixture
def ops(ops_module: ModuleType) -> Iterator[tuple[Any, Said]]:
    said = Said()
    served = ops_module.Ops(said)
    yield served, said
    for proc in [*served.processes.live.values(), *served.processes.ended.values()]:
        importlib.import_module("session_processes")._signal_session(proc.pid, signal.SIGKILL)
    for pid in list(served.processes.live):
        os.waitpid(pid, 0)


def test_a_fifo_or_socket_with_no_reader_is_refused_not_a_failure(ops: tuple[Any, Said], tmp_path: Path) -> None:
    """Issue 44: writing to a FIFO with no reader (or a socket) raised ENXIO, answered `failed` (a 500)."""
    served, said = ops
    os.mkfifo(tmp_path / "fifo")
    served.handle({"op": "fs", "id": "w", "call": "write", "path": f"{tmp_path}/fifo", "b": "aGk="})
    error = said.reply("w")["error"]
    assert error["kind"] == "invalid" and "not a regular file" in error["message"], error


def test_a_listing_longer_than_a_reply_may_carry_is_refused_saying_how_to_ask_for_less(
    ops: tuple[Any, Said], tmp_path: Path
) -> None:
    """Issue 44: files.list(depth=16) over a big tree answered more than the 1 MiB line the worker
    reads; the worker stopped reading the sandbox and every later call 504ed."""
    served, said = ops
    for n in range(3000):  # ~3,000 entries of ~350 bytes each: past the cap
        (tmp_path / f"{n:04d}-{'x' * 100}").write_bytes(b"")
    served.handle({"op": "fs", "id": "l", "call": "list", "path": str(tmp_path), "depth": 16})
    error = said.reply("l")["error"]
    assert error["kind"] == "too_large" and "smaller depth" in error["message"], error
    assert all(len(str(e)) < 1 << 20 for e in said.events)
    served.handle({"op": "fs", "id": "one", "call": "stat", "path": f"{tmp_path}/0000-{'x' * 100}"})
    assert said.reply("one")["ok"]["entry"]["type"] == "file", "the sandbox goes on answering"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_commands_background_children_die_at_its_lifetime_and_are_listed_and_signalable_until_then(
    ops: tuple[Any, Said], ops_module: ModuleType, tmp_path: Path
) -> None:
    """Issue 44: a command that started children in the background and ended left them running past
    its lifetime, out of proc.list and out of reach of proc.signal (their leader's pid was gone)."""
    served, said = ops
    pidfile = tmp_path / "child"
    script = f"sleep 300 & echo $! > {pidfile}.part; mv {pidfile}.part {pidfile}"
    served.handle(
        {"op": "proc.start", "id": "p", "argv": ["bash", "-c", script], "timeout_s": 1.5, "cwd": str(tmp_path)}
    )
    leader = said.reply("p")["ok"]["pid"]
    os.waitpid(leader, 0)  # as the supervisor reaps it: the leader has ended
    served.processes.reaped(leader, 0)
    child = int(str(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 5, "the command's child")))
    assert _alive(child)
    served.handle({"op": "proc.list", "id": "l"})
    listed = said.reply("l")["ok"]["processes"]
    assert [(p["pid"], p.get("leader_ended")) for p in listed] == [(leader, True)], "what it left is still listed"
    assert served.processes.timed(), "its lifetime is still to be enforced"
    wait_until(lambda: served.processes.expire() or not _alive(child), 5, "the child to die at the lifetime")
    served.handle({"op": "proc.list", "id": "after"})
    assert said.reply("after")["ok"]["processes"] == [], "nothing of it is left to list"


def test_proc_signal_reaches_what_a_command_left_after_its_leader_ended(ops: tuple[Any, Said], tmp_path: Path) -> None:
    served, said = ops
    pidfile = tmp_path / "child"
    served.handle({"op": "proc.start", "id": "p", "argv": ["bash", "-c", f"sleep 300 & echo $! > {pidfile}"],
                   "cwd": str(tmp_path)})  # fmt: skip
    leader = said.reply("p")["ok"]["pid"]
    os.waitpid(leader, 0)
    served.processes.reaped(leader, 0)
    child = int(str(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 5, "the child's pid")))
    served.handle({"op": "proc.signal", "id": "k", "pid": leader, "sig": "SIGKILL"})
    assert said.reply("k") == {"ev": "reply", "id": "k", "ok": {}}
    wait_until(lambda: not _alive(child), 5, "the child to die")
    served.handle({"op": "proc.signal", "id": "again", "pid": leader, "sig": "SIGKILL"})
    assert said.reply("again")["error"]["kind"] == "not_found", "nothing of it is left to signal"


def test_a_failed_fork_is_an_answer_that_says_the_process_limit_is_reached(
    ops: tuple[Any, Said], ops_module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    served, said = ops

    def no_fork() -> int:
        raise BlockingIOError(11, os.strerror(11))

    monkeypatch.setattr(os, "fork", no_fork)
    before = len(os.listdir("/proc/self/fd"))
    served.handle({"op": "proc.start", "id": "p", "argv": ["true"], "cwd": str(tmp_path)})
    error = said.reply("p")["error"]
    assert error["kind"] == "failed" and "process limit" in error["message"], error
    assert len(os.listdir("/proc/self/fd")) == before, "no pipe is left open"


def test_the_module_still_runs_under_the_sandbox_interpreter_flags() -> None:
    """The image runs it with python3 -I -S: it must import with nothing beyond the standard library."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(COMMON)!r}); "
                           "import session_ops, session"], capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
