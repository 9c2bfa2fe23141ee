"""The unmodified E2B SDK's files and commands against the live service (docs/e2b.md): they reach
the sandbox's own workspace and processes, stay inside the workspace's tree for every change, and
never reach the channel between the sandbox and its worker."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import (
    CommandExitException,
    CommandHandle,
    FilesystemEvent,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.conftest import Stack, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]


@pytest.fixture
def sandbox(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    monkeypatch.setenv("E2B_API_KEY", stack.keys["alpha"])
    monkeypatch.setenv("E2B_API_URL", f"{stack.base_url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{stack.base_url}/e2b/sandbox")
    with Sandbox.create(timeout=180) as sbx:
        yield sbx


def test_files_written_read_listed_moved_and_removed_are_the_cells_files(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/a.txt", "first line\n")
    assert info.path == "/home/user/notes/a.txt" and info.name == "a.txt"
    assert sandbox.run_code("open('/home/user/notes/a.txt').read()").text == "'first line\\n'"
    sandbox.run_code("open('made-by-cell.bin', 'wb').write(bytes(range(256)))")
    assert bytes(sandbox.files.read("/home/user/made-by-cell.bin", format="bytes")) == bytes(range(256))
    written = sandbox.files.write_files(
        [{"path": "two/x.txt", "data": "x"}, {"path": "/home/user/two/y.txt", "data": b"y"}]
    )
    assert sorted(w.path for w in written) == ["/home/user/two/x.txt", "/home/user/two/y.txt"]
    sandbox.files.write("stream.txt", io.BytesIO(b"through octet-stream"))  # envd 0.5.7's raw upload
    assert sandbox.files.read("stream.txt") == "through octet-stream"
    names = {(e.name, e.type) for e in sandbox.files.list("/home/user")}
    assert {("notes", FileType.DIR), ("made-by-cell.bin", FileType.FILE), ("two", FileType.DIR)} <= names
    assert {e.path for e in sandbox.files.list("/home/user/two", depth=1)} == {
        "/home/user/two/x.txt",
        "/home/user/two/y.txt",
    }
    assert sandbox.files.get_info("notes/a.txt").size == len("first line\n")
    assert sandbox.files.make_dir("deep/er/dir") is True and sandbox.files.make_dir("deep/er/dir") is False
    moved = sandbox.files.rename("notes/a.txt", "deep/er/dir/a.txt")
    assert moved.path == "/home/user/deep/er/dir/a.txt" and not sandbox.files.exists("notes/a.txt")
    sandbox.files.remove("deep")
    assert not sandbox.files.exists("deep/er/dir/a.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read("deep/er/dir/a.txt")
    assert sandbox.run_code("import os; os.path.exists('deep')").text == "False"


def test_file_calls_stay_in_the_workspace_and_never_reach_the_supervisor(sandbox: Sandbox) -> None:
    sandbox.run_code(
        "import os\nos.symlink('/proc/self/fd/1', 'evil')\nos.symlink('/etc', 'etc')\nos.mkfifo('fifo')\n"
        "os.symlink('notes.txt', 'relative-link')\nopen('notes.txt', 'w').write('kept')"
    )
    for path in ("evil", "etc/passwd-copy", "/etc/hostname", "../../etc/shadow-copy", "/proc/self/fd/1"):
        with pytest.raises((InvalidArgumentException, NotFoundException)):
            sandbox.files.write(path, '{"ev": "end", "id": "forged"}\n')
    for path in ("/proc/self/environ", "/proc/1/cmdline", "/sys/fs/cgroup/memory.max", "evil", "/dev/zero"):
        with pytest.raises((InvalidArgumentException, NotFoundException)):
            sandbox.files.read(path)
    started = time.monotonic()
    with pytest.raises(InvalidArgumentException, match="not a regular file"):
        sandbox.files.read("fifo")  # opened non-blocking: a FIFO stalls nothing
    assert time.monotonic() - started < 5
    assert sandbox.files.read("relative-link") == "kept", "a link that stays inside is followed"
    assert sandbox.files.read("/etc/hostname", format="bytes"), "the image outside the workspace is readable"
    assert sandbox.run_code("print('still', 'talking')").logs.stdout == ["still talking\n"]


def test_a_command_streams_its_output_and_a_failing_one_raises_with_its_exit_code(sandbox: Sandbox) -> None:
    heard: list[tuple[float, str]] = []
    result = sandbox.commands.run(
        "echo one; sleep 1; echo two; echo oops >&2; pwd; echo $GREETING",
        envs={"GREETING": "hello"},
        on_stdout=lambda text: heard.append((time.monotonic(), text)),
    )
    assert result.exit_code == 0 and result.stderr == "oops\n"
    assert result.stdout == "one\ntwo\n/home/user\nhello\n"
    assert heard[0][1] == "one\n" and heard[-1][0] - heard[0][0] >= 0.5, f"output came while it ran: {heard}"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"
    sandbox.files.write("sub/there.txt", "in sub")
    assert sandbox.commands.run("cat there.txt", cwd="/home/user/sub").stdout == "in sub"


def test_a_background_command_outlives_cells_and_is_listed_fed_and_killed(sandbox: Sandbox) -> None:
    fed = threading.Event()
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=0)
    sandbox.run_code("import subprocess; 1 + 1")  # the cell's end sweeps its own leftovers, not this
    assert handle.pid in {p.pid for p in sandbox.commands.list()}
    outcome: list[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(_wait(handle, fed)), daemon=True)
    waiter.start()
    sandbox.commands.send_stdin(handle.pid, "fed line\n")
    assert fed.wait(30), "what was fed came back out while the command ran"
    follower = sandbox.commands.connect(handle.pid)  # a second client follows the same process
    assert sandbox.commands.kill(handle.pid) is True
    waiter.join(30)
    assert isinstance(outcome[0], CommandExitException) and outcome[0].exit_code == -1, outcome
    assert outcome[0].stdout == "fed line\n"
    with pytest.raises(CommandExitException):
        follower.wait()
    assert handle.pid not in {p.pid for p in sandbox.commands.list()}, "its end was reported once it was reaped"
    assert sandbox.commands.kill(handle.pid) is False


def test_streamed_input_reaches_a_command_in_order_and_ends_with_its_stdin(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat", background=True, stdin=True, timeout=60)
    sandbox.commands.stream_input(handle.pid, [f"line {n}\n" for n in range(50)])
    sandbox.commands.close_stdin(handle.pid)
    ended = handle.wait()
    assert ended.stdout == "".join(f"line {n}\n" for n in range(50)), ended
    with pytest.raises(SandboxException):
        sandbox.commands.stream_input(handle.pid, ["too late"])  # it ended: not found


def _wait(handle: CommandHandle, fed: threading.Event) -> object:
    """The sync SDK hands a background command's output to the callbacks of wait()."""
    try:
        return handle.wait(on_stdout=lambda _: fed.set())
    except Exception as exc:  # the outcome is what the test reads
        return exc


def test_a_command_past_its_timeout_is_killed_in_the_sandbox(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 120", timeout=2)

    def gone() -> bool:
        return not [p for p in sandbox.commands.list() if "sleep 120" in " ".join(p.args)]

    wait_until(gone, 15, "the sandbox killed the command at its lifetime")


def test_envd_calls_need_the_sandboxs_token(sandbox: Sandbox, stack: Stack) -> None:
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "guess"}
    with httpx.Client(base_url=f"{stack.base_url}/e2b/sandbox", headers=headers) as raw:
        read = raw.get("/files", params={"path": "/etc/hostname"})
        listed = raw.post("/process.Process/List", json={}, headers={"Content-Type": "application/json"})
    assert (read.status_code, listed.status_code) == (401, 401), (read.text, listed.text)
    assert listed.json()["code"] == "unauthenticated"


def test_a_terminal_runs_an_interactive_shell_that_is_typed_to_and_resized(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(size=PtySize(rows=24, cols=80))
    sandbox.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; echo term=$TERM; tty; exit\n")
    shown = bytearray()
    ended = terminal.wait(on_pty=shown.extend)
    text = shown.decode(errors="replace")
    assert ended.exit_code == 0 and "30 100" in text and "term=xterm-256color" in text, text
    assert "/dev/pts/" in text, "the shell's terminal is a real one"
    with pytest.raises(SandboxException):
        sandbox.pty.resize(terminal.pid, PtySize(rows=30, cols=100))  # it ended: not found


def test_a_directory_watcher_reports_what_cells_commands_and_file_calls_change(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched/deep")
    handle = sandbox.files.watch_dir("watched", recursive=True)
    sandbox.files.write("watched/a.txt", "from a file call")
    sandbox.run_code("open('/workspace/watched/deep/b.txt', 'w').write('from a cell')")
    sandbox.commands.run("mkdir /home/user/watched/new && echo x > /home/user/watched/new/c.txt && rm watched/a.txt")
    seen: set[tuple[str, str]] = set()

    def reported() -> bool:
        seen.update((e.name, e.type.value) for e in handle.get_new_events())
        return {("a.txt", "create"), ("deep/b.txt", "write"), ("new", "create"), ("new/c.txt", "create"),
                ("a.txt", "remove")} <= seen  # fmt: skip

    wait_until(reported, 15, "the watcher to report the changes")
    handle.stop()
    with pytest.raises(SandboxException, match="watcher"):
        handle.get_new_events()
    with pytest.raises(SandboxException):
        sandbox.files.watch_dir("no-such-directory")


def test_a_watcher_id_of_another_sandbox_or_made_up_is_not_found(sandbox: Sandbox, stack: Stack) -> None:
    handle = sandbox.files.watch_dir("/home/user")
    try:
        with Sandbox.create(timeout=60) as other:
            headers = {"E2b-Sandbox-Id": other.sandbox_id, "X-Access-Token": other._envd_access_token or "",
                       "Content-Type": "application/json"}  # fmt: skip
            with httpx.Client(base_url=f"{stack.base_url}/e2b/sandbox", headers=headers) as raw:
                for watcher in (handle._watcher_id, "0" * 24, "../x"):
                    answer = raw.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": watcher})
                    assert answer.status_code in (400, 404), (watcher, answer.text)
    finally:
        handle.stop()


def test_the_async_sdk_streams_a_directorys_changes(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", stack.keys["alpha"])
    monkeypatch.setenv("E2B_API_URL", f"{stack.base_url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{stack.base_url}/e2b/sandbox")

    async def main() -> list[tuple[str, str]]:
        sbx = await AsyncSandbox.create(timeout=120)
        events: list[tuple[str, str]] = []
        arrived = asyncio.Event()

        def heard(event: FilesystemEvent) -> None:
            events.append((event.name, event.type.value))
            if ("streamed.txt", "remove") in events:
                arrived.set()

        try:
            handle = await sbx.files.watch_dir("/home/user", on_event=heard)
            await sbx.files.write("streamed.txt", "x")
            await sbx.files.remove("streamed.txt")
            await asyncio.wait_for(arrived.wait(), 15)
            await handle.stop()
            return events
        finally:
            await sbx.kill()

    events = asyncio.run(main())
    assert events[0] == ("streamed.txt", "create") and ("streamed.txt", "remove") in events, events


def test_the_async_sdk_writes_reads_and_runs_commands(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", stack.keys["alpha"])
    monkeypatch.setenv("E2B_API_URL", f"{stack.base_url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{stack.base_url}/e2b/sandbox")

    async def main() -> tuple[str, str, bool]:
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            await sbx.files.write("async.txt", "from async")
            text = await sbx.files.read("async.txt")
            ran = await sbx.commands.run("tr a-z A-Z < async.txt")
            return text, ran.stdout, await sbx.files.exists("nothing-here")
        finally:
            await sbx.kill()

    assert asyncio.run(main()) == ("from async", "FROM ASYNC", False)
