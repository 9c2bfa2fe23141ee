"""The E2B facade's files and commands, the pure parts: Connect framing and error codes, the path
translation between E2B's /home/user and the sandbox's /workspace, EntryInfo, a Start request's
checks and a process's end, the gzip upload's limit, the sandbox's errors as the room's, and the
filesystem and process calls' own checks (against an Envd whose `ask` is recorded, no session)."""

from __future__ import annotations

import asyncio
import gzip
import struct
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest

from execbox.core.errors import InvalidRequest, ServiceError
from execbox.e2b import commands, filesystem
from execbox.e2b.commands import SIGNALS, start_request
from execbox.e2b.connect import (
    END_STREAM,
    STREAM_TYPE,
    connect_code,
    end_stream,
    envelope,
    message,
    opened_envelope,
)
from execbox.e2b.envd import HOME, Envd, e2b_path, sandbox_path
from execbox.e2b.errors import (
    EnvdFailed,
    FileExists,
    FileTooLarge,
    NotOffered,
    PathNotFound,
    PathRefused,
)
from execbox.e2b.filesystem import entry_info, gunzip
from execbox.e2b.sandboxes import Opened

T = TypeVar("T")
MiB = 1 << 20


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def field_of(exc: pytest.ExceptionInfo[InvalidRequest]) -> str:
    """The one field an InvalidRequest names."""
    assert len(exc.value.problems) == 1, exc.value.problems
    return exc.value.problems[0].field


def unframe(frame: bytes) -> tuple[int, bytes]:
    flags, size = struct.unpack(">BI", frame[:5])
    assert size == len(frame) - 5, "the length prefix is the message's"
    return flags, frame[5:]


# -- Connect framing --------------------------------------------------------------------------------


def test_an_envelope_opens_to_the_message_it_was_made_of() -> None:
    sent = {"process": {"cmd": "echo", "args": ["é", "ü"]}, "n": 3}
    frame = envelope(sent)
    assert frame[0] == 0, "a message envelope has no flags"
    assert opened_envelope(frame) == sent


def test_the_end_of_a_stream_is_flagged_and_carries_the_error_when_there_is_one() -> None:
    flags, data = unframe(end_stream())
    assert (flags, message(data)) == (END_STREAM, {})
    flags, data = unframe(end_stream("not_found", "no process 7"))
    assert (flags, message(data)) == (END_STREAM, {"error": {"code": "not_found", "message": "no process 7"}})
    assert STREAM_TYPE == "application/connect+json"


def test_a_compressed_envelope_is_refused() -> None:
    frame = bytes([0x01]) + envelope({"a": 1})[1:]
    with pytest.raises(InvalidRequest, match="compressed") as exc:
        opened_envelope(frame)
    assert field_of(exc) == "body"


@pytest.mark.parametrize("frame", [envelope({"a": 1}) + b" ", envelope({"a": 1})[:-1]], ids=["longer", "shorter"])
def test_an_envelope_whose_length_does_not_match_its_body_is_refused(frame: bytes) -> None:
    with pytest.raises(InvalidRequest, match="length"):
        opened_envelope(frame)


def test_a_body_shorter_than_an_envelope_header_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="not a Connect envelope"):
        opened_envelope(b"\x00\x00\x00")


@pytest.mark.parametrize("data", [b"[1, 2]", b"null", b'"text"', b"3"])
def test_a_message_that_is_json_but_not_an_object_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        message(data)
    with pytest.raises(InvalidRequest, match="JSON object"):
        opened_envelope(struct.pack(">BI", 0, len(data)) + data)


@pytest.mark.parametrize("data", [b"{", b"\xff\xfe", b"{'a': 1}"])
def test_a_message_that_is_not_json_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not JSON"):
        message(data)


def test_an_empty_message_is_the_empty_object() -> None:
    assert message(b"") == {}
    assert opened_envelope(struct.pack(">BI", 0, 0)) == {}


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_argument"),
        (422, "invalid_argument"),
        (404, "not_found"),
        (409, "already_exists"),
        (413, "resource_exhausted"),
        (501, "unimplemented"),
        (502, "unavailable"),
        (503, "unavailable"),
        (504, "deadline_exceeded"),
        (500, "internal"),
        (507, "internal"),
        (418, "unknown"),
    ],
)
def test_an_http_status_becomes_its_connect_code(status: int, code: str) -> None:
    assert connect_code(status) == code


# -- paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "sandbox"),
    [
        ("notes.txt", "/workspace/notes.txt"),
        ("a/b/../c", "/workspace/a/c"),
        ("/home/user/x", "/workspace/x"),
        ("/home/user", "/workspace"),
        ("/home/user/", "/workspace"),
        ("~", "/workspace"),
        ("~/x", "/workspace/x"),
        ("~x", "/workspace/~x"),
        ("./x/./y", "/workspace/x/y"),
        ("/workspace/x", "/workspace/x"),
        ("/home/username/x", "/home/username/x"),
        ("/etc/hosts", "/etc/hosts"),
        ("../../etc/passwd", "/etc/passwd"),
        ("/home/user/../../etc/passwd", "/etc/passwd"),
        ("~/../other", "/home/other"),
    ],
)
def test_an_e2b_path_is_translated_to_the_sandboxs_absolute_one(asked: str, sandbox: str) -> None:
    # A path that leaves /home/user is passed on as what it is; the sandbox refuses changes there.
    assert sandbox_path(asked) == sandbox


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 4097, None])
def test_an_empty_nul_or_overlong_path_is_refused_naming_its_field(bad: str | None) -> None:
    with pytest.raises(InvalidRequest) as exc:
        sandbox_path(bad, "destination")
    assert field_of(exc) == "destination"


def test_a_path_of_4096_characters_is_taken() -> None:
    assert sandbox_path("x" * 4096) == "/workspace/" + "x" * 4096


@pytest.mark.parametrize(
    ("sandbox", "shown"),
    [
        ("/workspace", "/home/user"),
        ("/workspace/a/b", "/home/user/a/b"),
        ("/workspaces/a", "/workspaces/a"),
        ("/etc/passwd", "/etc/passwd"),
    ],
)
def test_the_sandboxs_workspace_is_shown_as_the_users_home(sandbox: str, shown: str) -> None:
    assert e2b_path(sandbox) == shown


@pytest.mark.parametrize("asked", ["/home/user/a/b", "~/c", "d", "/home/user", "/opt/x"])
def test_translating_there_and_back_gives_the_clean_absolute_e2b_path(asked: str) -> None:
    assert e2b_path(sandbox_path(asked)) == {"~/c": "/home/user/c", "d": "/home/user/d"}.get(asked, asked)


def test_a_path_with_a_leading_double_slash_is_translated_like_the_single_slash_one() -> None:
    assert sandbox_path("//home/user/x") == "/workspace/x"


# -- EntryInfo --------------------------------------------------------------------------------------


def sandbox_entry(**changes: Any) -> dict[str, Any]:
    """What session_files.py's `_entry` says of a file."""
    entry = {"name": "a.txt", "path": "/workspace/d/a.txt", "type": "file", "size": 12345678901, "mode": 0o644,
             "perm": "-rw-r--r--", "owner": "user", "group": "user", "mtime": 1700000000, "target": None}  # fmt: skip
    return {**entry, **changes}


def test_a_file_entry_becomes_e2bs_entry_info() -> None:
    assert entry_info(sandbox_entry()) == {
        "name": "a.txt",
        "type": "FILE_TYPE_FILE",
        "path": "/home/user/d/a.txt",
        "size": "12345678901",
        "mode": 0o644,
        "permissions": "-rw-r--r--",
        "owner": "user",
        "group": "user",
        "modifiedTime": "2023-11-14T22:13:20Z",
    }


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("file", "FILE_TYPE_FILE"),
        ("dir", "FILE_TYPE_DIRECTORY"),
        ("symlink", "FILE_TYPE_SYMLINK"),
        ("other", "FILE_TYPE_UNSPECIFIED"),
        (None, "FILE_TYPE_UNSPECIFIED"),
    ],  # fmt: skip
)
def test_each_kind_of_entry_has_its_enum_name(kind: str | None, shown: str) -> None:
    assert entry_info(sandbox_entry(type=kind))["type"] == shown


def test_only_a_symlink_has_a_target() -> None:
    link = entry_info(sandbox_entry(type="symlink", target="/etc/hosts"))
    assert (link["symlinkTarget"], link["isSymlink"]) == ("/etc/hosts", True)
    dangling = entry_info(sandbox_entry(type="symlink", target=None))
    assert dangling["symlinkTarget"] == ""
    for kind in ("file", "dir", "other"):
        shown = entry_info(sandbox_entry(type=kind, target="/etc/hosts"))
        assert "symlinkTarget" not in shown and "isSymlink" not in shown, kind


def test_a_fractional_mtime_is_an_rfc3339_utc_time_and_a_missing_one_is_left_out() -> None:
    assert entry_info(sandbox_entry(mtime=1700000000.25))["modifiedTime"] == "2023-11-14T22:13:20.250000Z"
    assert "modifiedTime" not in entry_info(sandbox_entry(mtime=None))


def test_an_entry_with_fields_missing_still_has_every_field() -> None:
    assert entry_info({}) == {"name": "", "type": "FILE_TYPE_UNSPECIFIED", "path": "", "size": "0", "mode": 0,
                              "permissions": "", "owner": "", "group": ""}  # fmt: skip


def test_only_paths_in_the_workspace_are_renamed() -> None:
    assert entry_info(sandbox_entry(path="/workspace"))["path"] == "/home/user"
    assert entry_info(sandbox_entry(path="/etc/hosts"))["path"] == "/etc/hosts"


# -- Start ------------------------------------------------------------------------------------------


def start(process: dict[str, Any] | None = None, timeout_ms: str | None = None, **body: Any) -> dict[str, Any]:
    return start_request({"process": {"cmd": "ls", **(process or {})}, **body}, timeout_ms)


def test_a_start_message_becomes_the_sandboxs_proc_start() -> None:
    request = start({"args": ["-l", "a b"], "envs": {"A": "1"}, "cwd": "~/d"}, "5000", tag="t1", stdin=True)
    assert request == {"op": "proc.start", "argv": ["ls", "-l", "a b"], "env": {"A": "1"}, "cwd": "/home/user/d",
                       "stdin": True, "tag": "t1", "timeout_s": 5.0}  # fmt: skip


def test_a_start_without_cwd_or_timeout_runs_in_the_home_without_a_lifetime() -> None:
    request = start()
    assert (request["argv"], request["cwd"], request["timeout_s"], request["tag"]) == (["ls"], HOME, None, None)
    assert (request["env"], request["stdin"]) == ({}, False)
    assert start(timeout_ms="0")["timeout_s"] is None, "0 is no timeout"
    assert start(timeout_ms="")["timeout_s"] is None


@pytest.mark.parametrize("process", [None, "ls", {}, {"cmd": ""}, {"cmd": 5}, {"args": ["x"]}])
def test_a_start_without_a_program_is_refused(process: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        start_request({"process": process}, None)
    assert field_of(exc) == "process.cmd"


def test_a_start_on_a_terminal_asks_for_its_size_and_a_bad_size_is_refused() -> None:
    assert start(pty={"size": {"cols": 80, "rows": "24"}})["pty"] == {"rows": 24, "cols": 80}
    bad: object
    for bad in ({}, {"size": {"cols": 0, "rows": 24}}, {"size": {"cols": "²", "rows": 1}}, {"size": []}, "x"):
        with pytest.raises(InvalidRequest) as exc:
            start(pty=bad)
        assert field_of(exc) == "pty.size"


@pytest.mark.parametrize("args", [["a\x00b"], [1], "ls -l", ["x"] * 4097])
def test_bad_args_are_refused(args: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        start({"args": args})
    assert field_of(exc) == "process.args"


@pytest.mark.parametrize(
    "envs",
    [
        {"EXECBOX_TOKEN": "x"},
        {"execbox_token": "x"},
        {"1BAD": "x"},
        {"A-B": "x"},
        {"A": "x\x00"},
        {"A": 1},
        {f"V{i}": "x" for i in range(65)},
        ["A=1"],
    ],  # fmt: skip
    ids=["reserved", "reserved-lower", "digit-first", "dash", "nul-value", "not-a-string", "65-names", "a-list"],
)
def test_an_environment_a_program_cannot_have_is_refused(envs: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        start({"envs": envs})
    assert field_of(exc) == "process.envs"


def test_64_environment_names_are_taken() -> None:
    envs = {f"V{i}": "x" for i in range(64)}
    assert start({"envs": envs})["env"] == envs


def test_a_tag_longer_than_256_characters_or_not_a_string_is_refused() -> None:
    assert start(tag="t" * 256)["tag"] == "t" * 256
    for tag in ("t" * 257, 5):
        with pytest.raises(InvalidRequest) as exc:
            start(tag=tag)
        assert field_of(exc) == "tag"


@pytest.mark.parametrize("timeout_ms", ["abc", "-5", "1.5", "1e3", " 5", "1" * 13])
def test_a_connect_timeout_that_is_not_milliseconds_is_refused(timeout_ms: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        start(timeout_ms=timeout_ms)
    assert field_of(exc) == "Connect-Timeout-Ms"


def test_a_connect_timeout_of_superscript_digits_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        start(timeout_ms="²")


def test_a_cwd_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        start({"cwd": 5})


def test_a_cwd_is_given_to_the_sandbox_as_the_client_spells_it() -> None:
    assert start({"cwd": "/home/user/proj/../src"})["cwd"] == "/home/user/src"
    assert start({"cwd": "/workspace/src"})["cwd"] == "/home/user/src"
    assert start({"cwd": "/tmp"})["cwd"] == "/tmp"
    with pytest.raises(InvalidRequest) as exc:
        start({"cwd": "a\x00"})
    assert field_of(exc) == "process.cwd"


# -- a process's end and listing --------------------------------------------------------------------


def test_a_process_that_exits_0_ended_without_error() -> None:
    assert commands._end({"ev": "pend", "pid": 7, "status": 0, "signal": None}) == {
        "exitCode": 0,
        "exited": True,
        "status": "exit status 0",
    }


def test_a_process_that_exits_3_ended_with_its_status_as_the_error() -> None:
    assert commands._end({"ev": "pend", "pid": 7, "status": 3, "signal": None}) == {
        "exitCode": 3,
        "exited": True,
        "status": "exit status 3",
        "error": "exit status 3",
    }


def test_a_killed_process_ended_as_gos_process_state_says() -> None:
    assert commands._end({"ev": "pend", "pid": 7, "status": 137, "signal": "SIGKILL"}) == {
        "exitCode": -1,
        "exited": False,
        "status": "signal: killed",
        "error": "signal: killed",
    }
    assert commands._end({"ev": "pend", "pid": 7, "status": 143, "signal": "SIGTERM"})["status"] == "signal: terminated"
    assert commands._end({"ev": "pend", "pid": 7, "signal": "SIGUSR1"})["status"] == "signal: SIGUSR1"
    assert commands._end({"ev": "pend", "pid": 7})["exitCode"] == -1, "no status at all is not a success"


def test_a_listed_process_is_e2bs_process_info() -> None:
    proc = {"pid": 9, "tag": "web", "argv": ["python", "-m", "http.server"], "env": {"A": "1"},
            "cwd": "/workspace/site"}  # fmt: skip
    assert commands._listed(proc) == {
        "pid": 9,
        "config": {"cmd": "python", "args": ["-m", "http.server"], "envs": {"A": "1"}, "cwd": "/home/user/site"},
        "tag": "web",
    }
    untagged = commands._listed({"pid": 10, "argv": [], "cwd": "/tmp"})
    assert "tag" not in untagged and untagged["config"] == {"cmd": "", "args": [], "envs": {}, "cwd": "/tmp"}


def test_only_kill_and_term_are_signals_a_client_may_send() -> None:
    assert SIGNALS == {"SIGNAL_SIGKILL": "SIGKILL", "SIGNAL_SIGTERM": "SIGTERM", 9: "SIGKILL", 15: "SIGTERM"}


# -- the gzip upload --------------------------------------------------------------------------------


def test_a_gzip_body_is_unpacked() -> None:
    data = bytes(range(256)) * 100
    assert gunzip(gzip.compress(data), MiB) == data
    assert gunzip(gzip.compress(b"x" * MiB), MiB) == b"x" * MiB, "exactly the limit is taken"


@pytest.mark.parametrize("body", [b"plain text", zlib.compress(b"zlib, not gzip"), b"\x1f\x8b\x08garbage"])
def test_a_body_that_is_not_gzip_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest, match="bad gzip") as exc:
        gunzip(body, MiB)
    assert field_of(exc) == "body"


def test_a_body_one_byte_over_the_limit_is_too_large() -> None:
    with pytest.raises(FileTooLarge):
        gunzip(gzip.compress(b"x" * (MiB + 1)), MiB)


def gzip_bomb(size: int) -> bytes:
    """`size` zero bytes gzip-compressed, made a MiB at a time (never all in memory)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    parts = [packer.compress(zeros) for _ in range(size // MiB)]
    return b"".join([*parts, packer.flush()])


def test_a_gzip_bomb_is_refused_without_being_inflated() -> None:
    bomb = gzip_bomb(50 * MiB)
    assert len(bomb) < MiB, "the bomb is small"
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLarge, match="more than the 1048576 bytes"):
            gunzip(bomb, MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MiB, f"{peak} bytes were allocated to refuse it: it was inflated"


def test_a_truncated_gzip_body_is_refused() -> None:
    whole = gzip.compress(b"hello world " * 1000)
    with pytest.raises(InvalidRequest):
        gunzip(whole[: len(whole) // 2], MiB)


# -- the sandbox's errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "error", "status"),
    [
        ("not_found", PathNotFound, 404),
        ("exists", FileExists, 409),
        ("too_large", FileTooLarge, 413),
        ("invalid", PathRefused, 400),
        ("failed", EnvdFailed, 500),
        ("something new", EnvdFailed, 500),
        (None, EnvdFailed, 500),
    ],  # fmt: skip
)
def test_each_kind_of_sandbox_error_is_raised_as_the_rooms(
    kind: str | None, error: type[ServiceError], status: int
) -> None:
    with pytest.raises(ServiceError) as exc:
        Envd.reply({"ev": "reply", "id": "0" * 24, "error": {"kind": kind, "message": "/workspace/x: why"}})
    assert type(exc.value) is error
    assert (exc.value.http_status, exc.value.message) == (status, "/workspace/x: why")


def test_a_sandbox_errors_message_is_cut_to_2000_characters() -> None:
    with pytest.raises(PathRefused) as exc:
        Envd.reply({"ev": "reply", "error": {"kind": "invalid", "message": "m" * 5000}})
    assert exc.value.message == "m" * 2000


def test_a_reply_without_an_error_is_its_ok_object() -> None:
    assert Envd.reply({"ev": "reply", "ok": {"pid": 5}}) == {"pid": 5}
    assert Envd.reply({"ev": "reply", "ok": [1, 2]}) == {}
    assert Envd.reply({"ev": "reply", "error": "not an object"}) == {}


# -- the calls' own checks, against a recorded Envd -------------------------------------------------


@dataclass(frozen=True)
class RecordedEnvd(Envd):
    """An Envd that answers each `ask` with the next of `replies` ({} once they run out)."""

    replies: list[dict[str, Any]] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)

    async def ask(self, opened: Opened, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        self.asked.append(request)
        return (self.replies.pop(0) if self.replies else {}), b""


OPENED = cast(Opened, object())


def recorded(*replies: dict[str, Any], max_file_bytes: int = 100) -> RecordedEnvd:
    return RecordedEnvd(store=cast(Any, None), streams=cast(Any, None), keys=cast(Any, None),
                        max_file_bytes=max_file_bytes, replies=list(replies))  # fmt: skip


@pytest.mark.parametrize(
    ("method", "body", "field_name"),
    [
        ("Stat", {}, "path"),
        ("Stat", {"path": 5}, "path"),
        ("Remove", {"path": "a\x00"}, "path"),
        ("ListDir", {"path": "d", "depth": 17}, "depth"),
        ("ListDir", {"path": "d", "depth": "x"}, "depth"),
        ("ListDir", {"path": "d", "depth": 1.5}, "depth"),
        ("Move", {"source": "a"}, "destination"),
        ("Move", {"destination": "b"}, "source"),
    ],  # fmt: skip
)
def test_a_filesystem_call_with_a_bad_field_is_refused_before_the_sandbox_is_asked(
    method: str, body: dict[str, Any], field_name: str
) -> None:
    envd = recorded()
    with pytest.raises(InvalidRequest) as exc:
        run(filesystem.rpc(envd, OPENED, method, body))
    assert field_of(exc) == field_name
    assert envd.asked == []


def test_filesystem_calls_ask_the_sandbox_with_its_paths_and_answer_with_the_clients() -> None:
    entry = sandbox_entry(path="/workspace/b.txt", name="b.txt")
    envd = recorded({"entry": entry}, {"entries": [entry, "junk"]})
    moved = run(filesystem.rpc(envd, OPENED, "Move", {"source": "a.txt", "destination": "/home/user/b.txt"}))
    assert moved["entry"]["path"] == "/home/user/b.txt"
    listed = run(filesystem.rpc(envd, OPENED, "ListDir", {"path": "~", "depth": "3"}))
    assert [e["path"] for e in listed["entries"]] == ["/home/user/b.txt"], "what is not an entry is left out"
    assert envd.asked == [{"op": "fs", "call": "move", "path": "/workspace/a.txt", "to": "/workspace/b.txt"},
                          {"op": "fs", "call": "list", "path": "/workspace", "depth": 3}]  # fmt: skip


def test_making_a_directory_that_exists_is_a_conflict_named_as_the_client_calls_it() -> None:
    envd = recorded({"made": False})
    with pytest.raises(FileExists, match="^/home/user/d already exists$"):
        run(filesystem.rpc(envd, OPENED, "MakeDir", {"path": "d"}))
    assert len(envd.asked) == 1, "no stat after a refusal"


def test_an_unknown_filesystem_call_is_not_offered() -> None:
    envd = recorded()
    with pytest.raises(NotOffered):
        run(filesystem.rpc(envd, OPENED, "Nope", {"path": "d"}))
    assert envd.asked == []


def test_a_write_of_nothing_the_same_path_twice_or_too_much_is_refused_before_anything_is_written() -> None:
    envd = recorded(max_file_bytes=10)
    with pytest.raises(InvalidRequest) as exc:
        run(filesystem.write(envd, OPENED, []))
    assert field_of(exc) == "file"
    with pytest.raises(InvalidRequest, match="the same path twice"):
        run(filesystem.write(envd, OPENED, [("a", b"1"), ("/home/user/a", b"2")]))
    with pytest.raises(InvalidRequest) as exc:
        run(filesystem.write(envd, OPENED, [("ok", b"1"), ("", b"2")]))
    assert field_of(exc) == "file"
    with pytest.raises(FileTooLarge, match="/home/user/big: 11 bytes"):
        run(filesystem.write(envd, OPENED, [("big", b"x" * 11)]))
    assert envd.asked == []


def test_a_write_sends_each_file_whole_and_answers_the_clients_paths() -> None:
    envd = recorded({"entry": {"name": "a"}}, {"entry": {"name": "b"}}, max_file_bytes=10)
    written = run(filesystem.write(envd, OPENED, [("a", b"0123456789"), ("~/d/b", b"")]))
    assert written == [{"name": "a", "type": "file", "path": "/home/user/a"},
                       {"name": "b", "type": "file", "path": "/home/user/d/b"}]  # fmt: skip
    assert envd.asked == [{"op": "fs", "call": "write", "path": "/workspace/a", "b": "MDEyMzQ1Njc4OQ=="},
                          {"op": "fs", "call": "write", "path": "/workspace/d/b", "b": ""}]  # fmt: skip


def test_a_read_needs_a_path_and_asks_for_at_most_the_limit() -> None:
    envd = recorded(max_file_bytes=10)
    with pytest.raises(InvalidRequest) as exc:
        run(filesystem.read(envd, OPENED, None))
    assert field_of(exc) == "path"
    run(filesystem.read(envd, OPENED, "~/f"))
    assert envd.asked == [{"op": "fs", "call": "read", "path": "/workspace/f", "limit": 10}]


@pytest.mark.parametrize(
    ("selector", "field_name"),
    [
        (None, "process"),
        ({}, "process"),
        ({"tag": 5}, "process"),
        ({"pid": "x"}, "process.pid"),
        ({"pid": -1}, "process.pid"),
        ({"pid": 1.5}, "process.pid"),
    ],  # fmt: skip
)
def test_a_bad_process_selector_is_refused_before_the_sandbox_is_asked(selector: Any, field_name: str) -> None:
    envd = recorded()
    with pytest.raises(InvalidRequest) as exc:
        run(commands.rpc(envd, OPENED, "CloseStdin", {"process": selector}))
    assert field_of(exc) == field_name
    assert envd.asked == []


def test_a_selected_pid_is_sent_as_a_number() -> None:
    envd = recorded()
    run(commands.rpc(envd, OPENED, "SendSignal", {"process": {"pid": "42"}, "signal": "SIGNAL_SIGTERM"}))
    run(commands.rpc(envd, OPENED, "SendSignal", {"process": {"pid": 43}, "signal": 9}))
    assert envd.asked == [{"op": "proc.signal", "pid": 42, "sig": "SIGTERM"},
                          {"op": "proc.signal", "pid": 43, "sig": "SIGKILL"}]  # fmt: skip


def test_a_tag_selects_the_running_process_of_that_tag_or_none() -> None:
    procs = {"processes": [{"pid": 5, "tag": "db"}, {"pid": 6, "tag": "web"}]}
    envd = recorded(procs, {})
    run(commands.rpc(envd, OPENED, "CloseStdin", {"process": {"tag": "web"}}))
    assert envd.asked == [{"op": "proc.list"}, {"op": "proc.close", "pid": 6}]
    with pytest.raises(PathNotFound, match="no running process tagged 'api'"):
        run(commands.rpc(recorded(procs), OPENED, "CloseStdin", {"process": {"tag": "api"}}))


@pytest.mark.parametrize("signal", ["SIGNAL_SIGINT", "SIGKILL", 2, None])
def test_a_signal_other_than_kill_or_term_is_refused(signal: Any) -> None:
    envd = recorded()
    with pytest.raises(InvalidRequest) as exc:
        run(commands.rpc(envd, OPENED, "SendSignal", {"process": {"pid": 1}, "signal": signal}))
    assert field_of(exc) == "signal"
    assert envd.asked == []


def test_an_unknown_process_call_is_not_offered_and_a_resize_needs_a_size() -> None:
    envd = recorded()
    with pytest.raises(NotOffered):
        run(commands.rpc(envd, OPENED, "Nope", {"process": {"pid": 1}}))
    with pytest.raises(InvalidRequest) as exc:
        run(commands.rpc(envd, OPENED, "Update", {"process": {"pid": 1}}))
    assert field_of(exc) == "pty.size"
    with pytest.raises(InvalidRequest) as exc:
        run(commands.rpc(envd, OPENED, "SendInput", {"process": {"pid": 1}, "input": {"neither": "aGk="}}))
    assert field_of(exc) == "input"
    assert envd.asked == []


def test_terminal_input_and_a_resize_go_to_the_sandbox_as_its_requests() -> None:
    envd = recorded()
    run(commands.rpc(envd, OPENED, "SendInput", {"process": {"pid": 7}, "input": {"pty": "aGk="}}))
    run(commands.rpc(envd, OPENED, "Update", {"process": {"pid": 7}, "pty": {"size": {"rows": 30, "cols": 100}}}))
    assert envd.asked == [{"op": "proc.input", "pid": 7, "b": "aGk="},
                          {"op": "proc.resize", "pid": 7, "rows": 30, "cols": 100}]  # fmt: skip


def test_stdin_input_is_decoded_from_either_base64_alphabet_and_sent_as_standard_base64() -> None:
    envd = recorded()
    run(commands.rpc(envd, OPENED, "SendInput", {"process": {"pid": 1}, "input": {"stdin": "-_8"}}))
    assert envd.asked == [{"op": "proc.input", "pid": 1, "b": "+/8="}]


@pytest.mark.parametrize(
    ("method", "body"),
    [
        (commands.rpc, {"process": {"pid": "²"}, "signal": "SIGNAL_SIGKILL"}),
        (filesystem.rpc, {"path": "d", "depth": "²"}),
    ],
    ids=["pid", "depth"],
)
def test_a_number_of_superscript_digits_is_refused(method: Any, body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        run(method(recorded(), OPENED, "SendSignal" if method is commands.rpc else "ListDir", body))


def test_a_signal_that_is_not_a_name_or_number_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        run(commands.rpc(recorded(), OPENED, "SendSignal", {"process": {"pid": 1}, "signal": ["SIGNAL_SIGKILL"]}))


def test_a_client_streams_envelopes_are_read_across_chunk_boundaries() -> None:
    from execbox.e2b import connect as connectrpc

    stream = connectrpc.envelope({"start": {"process": {"pid": 3}}}) + connectrpc.envelope({"data": {}})
    stream += connectrpc.end_stream()

    async def chunks(size: int) -> AsyncIterator[bytes]:
        for at in range(0, len(stream), size):
            yield stream[at : at + size]

    async def read(size: int, cap: int = 1 << 20) -> list[dict[str, Any]]:
        return [m async for m in connectrpc.envelopes(chunks(size), cap)]

    for size in (1, 3, 7, len(stream)):
        assert run(read(size)) == [{"start": {"process": {"pid": 3}}}, {"data": {}}], size
    with pytest.raises(InvalidRequest, match="at most 10"):
        run(read(4, cap=10))

    async def cut() -> list[dict[str, Any]]:
        async def partial() -> AsyncIterator[bytes]:
            yield stream[:8]

        return [m async for m in connectrpc.envelopes(partial(), 1 << 20)]

    with pytest.raises(InvalidRequest, match="inside an envelope"):
        run(cut())


def test_streamed_input_sends_each_chunk_to_the_process_it_named_first() -> None:
    from execbox.e2b import connect as connectrpc

    envd = recorded()
    events: list[dict[str, Any]] = [
        {"start": {"process": {"pid": 9}}},
        {"data": {"input": {"stdin": "YQ=="}}},
        {"keepalive": {}},
        {"data": {"input": {"stdin": "Yg=="}}},
    ]
    body = b"".join(connectrpc.envelope(e) for e in events)

    async def once(data: bytes) -> AsyncIterator[bytes]:
        yield data

    answer = run(commands.stream_input(envd, OPENED, once(body)))
    assert answer == connectrpc.envelope({}) + connectrpc.end_stream()
    assert envd.asked == [{"op": "proc.input", "pid": 9, "b": "YQ=="}, {"op": "proc.input", "pid": 9, "b": "Yg=="}]
    refused = run(commands.stream_input(recorded(), OPENED, once(connectrpc.envelope({"data": {"input": {}}}))))
    assert b'"invalid_argument"' in refused and b"start event" in refused
