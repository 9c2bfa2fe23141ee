"""The in-image launcher, run here as a plain process against a temporary work directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from execbox.sandbox.docker.capture import STDERR, STDOUT, AttachCapture
from execbox.sandbox.protocol import done_marker, frame_files

LAUNCHER = Path(__file__).resolve().parents[2] / "sandbox-images" / "common" / "launch.py"
RUN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec); spec.loader.exec_module(launch)
launch.WORKDIR = sys.argv[2]
sys.argv = ["launch.py", *sys.argv[3:]]
sys.exit(launch.main())
"""


def launch(
    tmp_path: Path, stdin: bytes, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", RUN, str(LAUNCHER), str(tmp_path), *argv],
        input=stdin,
        capture_output=True,
        timeout=30,
        check=False,
        env=None if env is None else {**os.environ, **env},
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


def test_environment_from_frame_reaches_program_only(tmp_path: Path) -> None:
    env = (("GREETING", "a=b c\nd"), ("EMPTY", ""))
    frame = frame_files((("main.py", b"import os\nprint(repr(os.environ['GREETING']), repr(os.environ['EMPTY']))"),),
                        env=env)  # fmt: skip
    done = launch(tmp_path, frame, sys.executable, "main.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"'a=b c\\nd' ''\n"


def test_marker_reports_status_and_output_and_capture_strips_it() -> None:
    nonce = "00aa11bb22cc33dd"
    wake = threading.Event()
    capture = AttachCapture(100, done_marker(nonce), wake)
    marker = done_marker(nonce) + b"1:137:1:5242880:\x00"
    capture.take(STDERR, b"warning\n")
    capture.take(STDERR, b"\n\x00execbox-done:" + b"ffffffffffffffff:0:0:0:0:\x00")  # a wrong nonce: kept as output
    capture.take(STDERR, marker[:7])
    capture.take(STDERR, marker[7:])
    assert not capture.done and not wake.is_set()  # stdout may still be on its way
    capture.take(STDOUT, b"result" + marker)
    assert capture.done and wake.is_set()
    assert (capture.produced, capture.exit_code, capture.oom, capture.peak) == (True, 137, True, 5 << 20)
    stderr, total, truncated = capture.result(STDERR)
    assert stderr.startswith(b"warning\n\n\x00execbox-done:ffff") and not stderr.endswith(b"5242880:\x00")
    assert total == len(stderr) and not truncated
    assert capture.result(STDOUT) == (b"result", 6, False)


def test_a_frame_that_says_exec_makes_the_program_the_launchers_own_process(tmp_path: Path) -> None:
    """A session's supervisor takes the launcher's place (in a sandbox: PID 1, which its code cannot
    signal): same pid, the frame's environment and stdin, the work directory, and no marker."""
    code = b"import os, sys\nprint(os.getpid(), os.environ['WHO'], os.getcwd() == sys.argv[1], sys.stdin.read())"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(LAUNCHER), str(tmp_path), sys.executable, "main.py", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    frame = frame_files((("main.py", code),), "f00d", (("WHO", "sup"),), become=True)
    out, err = proc.communicate(frame + b"requests", timeout=30)
    assert (out.decode(), proc.returncode) == (f"{proc.pid} sup True requests\n", 0), err
    assert b"execbox-done" not in out + err


def test_launcher_writes_marker_with_program_status(tmp_path: Path) -> None:
    frame = frame_files((("main.py", b"import sys\nopen('out/r.txt', 'w').write('x')\nsys.exit(3)"),), "abc123")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(LAUNCHER), str(tmp_path), sys.executable, "main.py"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(frame)
    proc.stdin.close()
    tail = b""
    while not tail.endswith(b"\x00") or b"execbox-done" not in tail:
        tail += proc.stderr.read(1)
    proc.send_signal(signal.SIGUSR1)  # not PID 1 here: the release signal ends it
    assert proc.wait(10) == 3
    proc.stderr.close()
    assert tail.endswith(b"\x00") and done_marker("abc123") + b"1:3:" in tail  # then OOM and peak: the cgroup's


def _run_to_marker(tmp_path: Path, frame: bytes, *argv: str) -> tuple[bytes, bytes]:
    """Run the launcher with a nonce'd frame until its marker; (stdout, the marker tail of stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, str(LAUNCHER), str(tmp_path), *argv],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None and proc.stdout is not None
    proc.stdin.write(frame)
    proc.stdin.close()
    tail = b""
    while not (tail.endswith(b"\x00") and b"execbox-done" in tail):
        chunk = proc.stderr.read(1)
        assert chunk, tail
        tail += chunk
    proc.send_signal(signal.SIGUSR1)
    proc.wait(10)
    out = proc.stdout.read()
    proc.stdout.close()
    proc.stderr.close()
    return out, tail


def test_a_program_that_makes_the_launcher_its_tracer_keeps_its_status(tmp_path: Path) -> None:
    code = (b"import ctypes, os\nctypes.CDLL(None).ptrace(0, 0, None, None)\n"
            b"for _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
            b"print('survived', flush=True)\nos._exit(5)\n")  # fmt: skip
    out, tail = _run_to_marker(tmp_path, frame_files((("main.py", code),), "feed"), sys.executable, "main.py")
    assert out.startswith(b"survived\n") and done_marker("feed") + b"0:5:" in tail, (out, tail)
    assert b"Traceback" not in tail


def test_launcher_faults_are_reported_in_the_marker_never_on_the_programs_streams(tmp_path: Path) -> None:
    bad = frame_files((("../escape", b"x"),), "cafe")
    _, tail = _run_to_marker(tmp_path / "w", bad, "true")
    assert tail.startswith(done_marker("cafe")) and done_marker("cafe") + b"0:L1:" in tail, tail
    _, tail = _run_to_marker(tmp_path, frame_files((), "beef"), "/no/such/program")
    assert done_marker("beef") + b"0:L2:" in tail and b"no/such" not in tail, tail


def test_capture_reads_a_launcher_fault() -> None:
    capture = AttachCapture(100, done_marker("ab"), threading.Event())
    for stream in (STDOUT, STDERR):
        capture.take(stream, done_marker("ab") + b"0:L2:0:0:\x00")
    assert capture.done and capture.exit_code is None and capture.fault is not None and "start" in capture.fault


FAKE_PRELOAD = """
import os, sys, time
os.write(4, b".")  # its interpreter is up
time.sleep(float(sys.argv[1]))  # one module's import
os.write(4, b".r")
while os.read(3, 1 << 16):
    pass
os.write(4, b"y")
print("preloaded", flush=True)
"""


def _preloading(tmp_path: Path, import_s: float, costs: str | None) -> dict[str, str]:
    """The environment of a warm container whose preload takes import_s for its one module."""
    script = tmp_path.parent / f"{tmp_path.name}-preload.py"
    script.write_text(FAKE_PRELOAD)
    env = {"EXECBOX_PRELOAD": f"{sys.executable} {script} {import_s}", "EXECBOX_PRELOAD_MODULES": "slowmod"}
    return env if costs is None else {**env, "EXECBOX_PRELOAD_COSTS": costs}


def _launched(tmp_path: Path, program: bytes, import_s: float, costs: str | None) -> tuple[bytes, float]:
    """The program run by a launcher whose preload takes import_s: (its stdout, seconds taken). The
    modules the program imports are empty files beside it, so that a fresh start finds them too."""
    modules = [(f"{name}.py", b"") for name in ("slowmod", "slowmodule", "my_slowmod")]
    started = time.monotonic()
    done = launch(tmp_path, frame_files((("main.py", program), *modules)), sys.executable, "main.py",
                  env=_preloading(tmp_path, import_s, costs))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout, time.monotonic() - started


def test_a_job_naming_a_module_still_importing_waits_for_the_preload_and_runs_in_it(tmp_path: Path) -> None:
    assert _launched(tmp_path, b"import slowmod\nprint('fresh')", 0.5, "20,5000")[0] == b"preloaded\n"


def test_a_job_naming_no_preloaded_module_starts_fresh_at_once(tmp_path: Path) -> None:
    out, seconds = _launched(tmp_path, b"import slowmodule, my_slowmod\nprint('fresh')", 20, "20,5000")  # other words
    assert out == b"fresh\n" and seconds < 20


def test_a_preload_slower_than_its_costs_say_is_given_up_after_a_fresh_starts_time(tmp_path: Path) -> None:
    out, seconds = _launched(tmp_path, b"import slowmod\nprint('fresh')", 20, "20,300")
    assert out == b"fresh\n" and seconds < 20


def test_without_declared_costs_a_job_never_waits_for_the_preload(tmp_path: Path) -> None:
    assert _launched(tmp_path, b"import slowmod\nprint('fresh')", 0.5, None)[0] == b"fresh\n"


def test_the_preloads_settings_never_reach_the_program(tmp_path: Path) -> None:
    frame = frame_files((("main.py", b"import os\nprint(sorted(k for k in os.environ if 'PRELOAD' in k))"),))
    done = launch(tmp_path, frame, sys.executable, "main.py", env=_preloading(tmp_path, 20, "20,5000"))
    assert done.stdout == b"[]\n", done.stderr
