"""The artifact collector over synthetic tar streams (what the engine's get_archive returns)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

from execbox.files.blobs import LocalArtifactStore
from execbox.files.collect import ArtifactCaps, Collector, safe_name

CAPS = ArtifactCaps(file_bytes=100, total_bytes=150, files=3)


def stream(*members: tuple[str, bytes, bytes, str]) -> Iterator[bytes]:
    """(name, tar type, data, link target) members as the engine would stream them, in chunks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, data, target in members:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, target
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    raw = buffer.getvalue()
    return (raw[i : i + 777] for i in range(0, len(raw), 777))


def collect(tmp_path: Path, *members: tuple[str, bytes, bytes, str], **kw: object) -> Collector:
    collector = Collector("exe_" + "a" * 26, LocalArtifactStore(tmp_path), CAPS, **kw)  # type: ignore[arg-type]
    collector(stream(*members))
    return collector


REG, SYM, LNK, CHR = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE


def test_regular_files_are_kept_with_hash_and_type(tmp_path: Path) -> None:
    got = collect(tmp_path, ("out", tarfile.DIRTYPE, b"", ""), ("out/a/report.md", REG, b"# hi", ""))
    (kept,) = got.kept
    assert (kept.name, kept.size, kept.media_type) == ("a/report.md", 4, "text/markdown")
    assert kept.sha256 == hashlib.sha256(b"# hi").hexdigest()
    assert b"".join(LocalArtifactStore(tmp_path).read("exe_" + "a" * 26, "a/report.md")) == b"# hi"


def test_links_and_devices_are_listed_never_read(tmp_path: Path) -> None:
    got = collect(
        tmp_path,
        ("out/passwd", SYM, b"", "/etc/passwd"),
        ("out/hard", LNK, b"", "etc/passwd"),
        ("out/tty", CHR, b"", ""),
    )
    assert got.kept == []
    assert {s["name"]: s["reason"] for s in got.skipped} == {
        "passwd": "symlink",
        "hard": "hardlink",
        "tty": "not_a_file",
    }


def test_unsafe_names_are_refused_and_store_paths_never_use_names(tmp_path: Path) -> None:
    got = collect(tmp_path, ("out/../../x", REG, b"x", ""), ("out/ok\x07bell", REG, b"y", ""))
    assert got.kept == [] and {s["reason"] for s in got.skipped} == {"unsafe_name"}
    assert not (tmp_path.parent / "x").exists()
    for ok in ("a.txt", "dir/b c.png", "ünï.md"):
        assert safe_name(ok)
    for bad in ("", "/abs", "../x", "a/../b", "a//b", "a\\b", "a\x00b", "x\udcff"):
        assert not safe_name(bad)


def test_caps_are_decided_before_reading_and_listed(tmp_path: Path) -> None:
    got = collect(
        tmp_path,
        ("out/big", REG, b"x" * 101, ""),
        ("out/a", REG, b"x" * 80, ""),
        ("out/b", REG, b"x" * 80, ""),
        ("out/c", REG, b"x" * 10, ""),
        ("out/d", REG, b"x", ""),
        ("out/e", REG, b"x", ""),
    )
    assert [k.name for k in got.kept] == ["a", "c", "d"]
    reasons = {n["name"]: n["reason"] for n in got.not_kept}
    assert "larger than 100" in reasons["big"] and "total would pass 150" in reasons["b"]
    assert "more than 3 files" in reasons["e"] and got.over_cap


def test_result_file_is_read_not_kept_as_artifact(tmp_path: Path) -> None:
    got = collect(
        tmp_path, ("out/.execbox/result.json", REG, b'{"outputs": {"a": 1}}', ""), ("out/.execbox/other", REG, b"z", "")
    )
    assert got.result == b'{"outputs": {"a": 1}}' and got.kept == [] and got.skipped == []


def test_globs_select_from_the_working_directory(tmp_path: Path) -> None:
    got = collect(
        tmp_path,
        ("workspace/main.py", REG, b"code", ""),
        ("workspace/report.md", REG, b"r", ""),
        ("workspace/out/.execbox/result.json", REG, b"{}", ""),
        root="workspace",
        globs=("*.md",),
    )
    assert [k.name for k in got.kept] == ["report.md"] and got.result == b"{}"
