"""What a program's output directory may cost the service (issue 44, items 8 and 9), from the
program's side: the bubblewrap helper's walk (execbox.sandbox.bwrap.collect.tar_output, as root on
the host) and the worker's reading of any runtime's stream (execbox.files.collect.Collector) are
bounded in entries, depth and time, a link in place of `out` is sent and listed as a link, and what
is cut is said. No root, no bwrap, no Docker: the walk reads a temporary directory."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from execbox.files import collect as collect_module
from execbox.files.blobs import LocalArtifactStore
from execbox.files.collect import DEPTH, LISTED, MEMBERS, ArtifactCaps, Collector
from execbox.sandbox.bwrap import collect as walk


def sent_members(workspace: Path, **bounds: float) -> tuple[list[tarfile.TarInfo], walk.Collected]:
    """The members tar_output sends of workspace/out, and what it said at the end."""
    chunks: list[bytes] = []
    ended = walk.tar_output(workspace, "out", 1 << 30, chunks.append, **bounds)  # type: ignore[arg-type]
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        return tar.getmembers(), ended


def nested(base: Path, levels: int) -> Path:
    """`levels` directories named d, one in another, under base (made without recursion)."""
    fd = os.open(base, os.O_RDONLY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return base


def flatten(top: Path) -> None:
    """Move each nested `d` up beside `top`, one level at a time, so that nothing is deep any more."""
    current, level = top, 0
    while (current / "d").is_dir():
        level += 1
        (current / "d").rename(top.with_name(f"level{level}"))
        current = top.with_name(f"level{level}")


def test_a_thousand_nested_directories_are_walked_without_recursion_to_the_depth_bound(tmp_path: Path) -> None:
    """~1,100 nested directories under out: the helper's tarfile.add recursed into each and raised
    RecursionError (the run lost its stdout). The walk is a loop and stops descending DEPTH levels down."""
    (tmp_path / "out").mkdir()
    nested(tmp_path / "out", 1100)
    try:
        members, ended = sent_members(tmp_path)
    finally:
        flatten(tmp_path / "out")  # shutil.rmtree (pytest's clean-up) recurses too
    assert ended == walk.Collected()
    deepest = max(m.name.count("/") for m in members)
    assert deepest == walk.DEPTH and all(m.isdir() for m in members)


def test_out_made_a_link_is_sent_as_the_link_never_followed(tmp_path: Path) -> None:
    """`out` replaced by a link to a host directory: the collection failed (the run's fault, retried);
    it is sent as one link member, as the engine sends it under runc, and nothing behind it is read."""
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "secret").write_text("host")
    (tmp_path / "out").symlink_to(tmp_path / "target")
    members, ended = sent_members(tmp_path)
    assert ended == walk.Collected()
    assert [(m.name, m.issym()) for m in members] == [("out", True)]


def test_many_entries_are_walked_to_the_entry_bound_and_the_cut_is_said(tmp_path: Path) -> None:
    """A 1 s program making 50,000 empty files cost 32 s of the root helper's time: its walk now
    stops after its entry bound (a little past the worker's, so the worker sees the cut first), and
    says so. (A bound of 50 here: the same loop as the shipped 10,050, in a unit test's time.)"""
    assert walk.MEMBERS > MEMBERS
    out = tmp_path / "out"
    out.mkdir()
    for i in range(60):
        (out / f"f{i}").touch()
    members, ended = sent_members(tmp_path, members=50)
    assert len(members) == 50
    assert ended.error is None and ended.cut is not None and "50 entries" in ended.cut


def test_the_walk_stops_at_its_time_bound(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    for i in range(10):
        (tmp_path / "out" / f"f{i}").touch()
    members, ended = sent_members(tmp_path, within_s=-1.0)
    assert members == [] and ended.cut is not None


def empty_files(count: int, consumed: list[int]) -> Iterator[bytes]:
    """A tar stream of out/ and `count` empty files, made as it is read; consumed[0] counts members sent."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(-1, count):
            info = tarfile.TarInfo("out" if i < 0 else f"out/f{i}")
            info.type = tarfile.DIRTYPE if i < 0 else tarfile.REGTYPE
            tar.addfile(info)
            consumed[0] += 1
            if buffer.tell() >= 1 << 16:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
    yield buffer.getvalue()


def test_many_empty_files_are_read_to_the_bound_and_listed_in_a_hundred_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker read every entry of any runtime's stream and listed each file not kept: a 6.6 MB
    result for 50,000 empty files. It reads its entry bound, lists LISTED names, then says the rest.
    (A bound of 1,000 here for 50,000 files: the shipped 10,000 in a unit test's time.)"""
    monkeypatch.setattr(collect_module, "MEMBERS", 1000)
    consumed = [0]
    collector = Collector("exe_many", LocalArtifactStore(tmp_path), ArtifactCaps(1 << 20, 1 << 20, 100))
    collector(empty_files(50_000, consumed))
    assert consumed[0] < 1000 + 500, "the stream was read past the bound"
    assert len(collector.kept) == 100 and collector.over_cap
    listed = collector.not_kept + collector.skipped
    assert len(listed) == LISTED + 2
    assert "not looked at" in collector.not_kept[-1]["reason"]
    assert collector.skipped[-1]["reason"].startswith(f"{1000 - 1 - 100 - LISTED} more not kept")


def test_a_directory_at_the_depth_bound_is_listed_once_whichever_runtime_sent_it(tmp_path: Path) -> None:
    """The helper sends the directory at the bound alone, the engine everything below it: the
    listing is the same one line."""
    levels = ["d"] * (DEPTH + 5)

    def stream(with_contents: bool) -> Iterator[bytes]:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for depth in range(DEPTH + 5 if with_contents else DEPTH + 1):
                info = tarfile.TarInfo("/".join(["out", *levels[:depth]]))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            if with_contents:
                tar.addfile(tarfile.TarInfo("/".join(["out", *levels, "deep.txt"])), io.BytesIO(b""))
        yield buffer.getvalue()

    listings = []
    for with_contents in (True, False):
        collector = Collector("exe_deep", LocalArtifactStore(tmp_path), ArtifactCaps(1 << 20, 1 << 20, 100))
        collector(stream(with_contents))
        assert collector.kept == [] and not collector.over_cap
        listings.append(collector.skipped)
    assert listings[0] == listings[1] and len(listings[0]) == 1
    assert listings[0][0]["name"] == "/".join(["d"] * DEPTH)


def test_a_socket_in_out_is_left_out_not_a_failure(tmp_path: Path) -> None:
    """tar has no entry for a socket (gettarinfo answers None): it is left out, as the engine does."""
    import socket

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("x")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "out" / "s"))
        members, ended = sent_members(tmp_path)
    assert ended == walk.Collected() and sorted(m.name for m in members) == ["out", "out/kept.txt"]
