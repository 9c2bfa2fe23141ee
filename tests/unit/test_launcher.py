"""The in-image launcher, run here as a plain process against a temporary work directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from execbox.sandbox.docker import frame_files

LAUNCHER = Path(__file__).resolve().parents[2] / "sandbox-images" / "common" / "launch.py"
RUN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec); spec.loader.exec_module(launch)
launch.WORKDIR = sys.argv[2]
sys.argv = ["launch.py", *sys.argv[3:]]
sys.exit(launch.main())
"""


def launch(tmp_path: Path, stdin: bytes, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", RUN, str(LAUNCHER), str(tmp_path), *argv],
        input=stdin,
        capture_output=True,
        timeout=30,
        check=False,
    )


def test_files_are_written_and_rest_of_stdin_reaches_program(tmp_path: Path) -> None:
    frame = frame_files((("main.py", b"import sys\nprint(sys.stdin.read().upper())\n"), ("data/x.txt", b"hi")))
    done = launch(tmp_path, frame + b"user input", sys.executable, "main.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"USER INPUT\n"
    assert (tmp_path / "data" / "x.txt").read_bytes() == b"hi"


def test_traversal_in_frame_is_refused(tmp_path: Path) -> None:
    for bad in ("../escape", "/abs", "a/../../b", "a//b"):
        done = launch(tmp_path / "w", frame_files(((bad, b"x"),)), "true")
        assert done.returncode == 120 and b"refusing" in done.stderr
    assert not (tmp_path / "escape").exists()


def test_truncated_frame_is_refused(tmp_path: Path) -> None:
    done = launch(tmp_path, frame_files((("main.py", b"print(1)"),))[:-3], "true")
    assert done.returncode == 120 and b"stdin ended" in done.stderr
