"""execbox preloaded interpreter: started by the launcher in a warm sandbox before any code
arrives, it imports the modules in EXECBOX_PRELOAD_MODULES, then waits for its job on fd 3 (the
program's argv and environment, NUL-separated, the argv count first). If it can run the job as a
fresh `python3 /opt/execbox/oneshot.py main.py` would, it answers "y" on fd 4 and becomes that
program in this same process: still single-use, the sandbox user, every limit of the container.
Otherwise it answers "n" and exits, and the launcher starts a fresh interpreter.

It declines when the job's environment sets, differently from the one it started with, a variable
that import-time behaviour depends on (PYTHON*, thread pools of the numeric libraries, matplotlib,
the dynamic loader, PATH, HOME): those were read when the modules were imported.

It says "." on fd 4 as soon as it runs and after each module, and "r" once its imports are done:
the launcher weighs from that progress whether a job that arrives earlier waits for it or starts
a fresh interpreter (launch.py). While the container waits in the pool the worker gives it the
lowest CPU weight, so that its imports never take the CPU from a run in progress.
"""

import atexit
import gc
import importlib
import io
import os
import sys

RUNNER = "/opt/execbox/oneshot.py"
READY = "/tmp/.execbox-preloaded"
"""Exists while the imports are done and no job has come: what an operator (or a test) can see."""
IMPORT_TIME = ("PYTHON", "OMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "VECLIB_", "BLIS_", "MPL", "LD_", "MALLOC_")
IMPORT_TIME_NAMES = {"PATH", "HOME", "TZ", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR"}


def _read_job() -> tuple[list[str], dict[str, str]]:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(3, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    fields = b"".join(chunks).decode("utf-8").split("\0")
    count = int(fields[0])
    argv = fields[1 : 1 + count]
    env = dict(pair.partition("=")[::2] for pair in fields[1 + count :] if pair)
    return argv, env


def _can_run(argv: list[str], env: dict[str, str]) -> bool:
    if len(argv) != 3 or argv[1] != RUNNER or not os.path.basename(argv[0]).startswith("python"):
        return False
    names = set(env) | set(os.environ)
    touched = {n for n in names if n.startswith(IMPORT_TIME) or n in IMPORT_TIME_NAMES}
    return all(env.get(n) == os.environ.get(n) for n in touched)


def main() -> int:
    os.write(4, b".")
    for name in filter(None, os.environ.get("EXECBOX_PRELOAD_MODULES", "").split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # the run imports it again and fails as it would have
            pass
        os.write(4, b".")
    open(READY, "w").close()
    os.write(4, b"r")
    argv, env = _read_job()
    os.unlink(READY)
    if not _can_run(argv, env):
        os.write(4, b"n")
        return 0
    os.write(4, b"y")
    os.close(3)
    os.close(4)
    os.environ.clear()
    os.environ.update(env)
    os.chdir("/workspace")
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(RUNNER)
    import oneshot

    gc.freeze()  # the preloaded objects: never scanned again, not by the program's collections either
    try:
        code = oneshot.main()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    _exit(code)
    return code  # never reached: _exit ends the process


def _exit_code(code: object) -> int:
    """What the interpreter makes of sys.exit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _exit(code: int) -> None:
    """End as the interpreter's own shutdown would for the program (its threads joined, its atexit
    handlers run, its open files flushed), without tearing down the preloaded modules, which takes
    ~80 ms for numpy and pandas and serves nobody: the container is removed after this run."""
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for obj in gc.get_objects():  # only what the program made: the rest is frozen
        if type(obj) in buffered and not obj.closed:
            try:
                obj.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    os._exit(code)


if __name__ == "__main__":
    main()
