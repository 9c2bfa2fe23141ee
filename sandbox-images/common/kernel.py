"""execbox session kernel: one IPython interpreter that runs a session's cells in turn.

Started by the session supervisor (session.py), never by the worker directly. Its fd 0 carries
the supervisor's requests (one JSON object per line: {"id", "code", "env"}), fd 1 and 2 are pipes
to the supervisor (the cell's stdout and stderr), and fd 3 is where it reports each cell's end
(one JSON line: {"id", "status", "changed", "kernel"}).

After each cell the kernel hands itself over to a copy: it forks, the copy (which has the one thread
that forked, and every variable) goes on to wait for the next request, and this process reports the
copy's pid and exits. Whatever the cell left running in this process (a thread reading fd 0 for the
next request, writing fd 3, or watching os.environ) ends with it; the supervisor kills any process
the cell left, checks the copy, and only then reports the call's end (see session.py).

The cell runs through IPython's run_cell, so the interpreter keeps its variables, imports and
loaded data from one cell to the next, and the value of a cell's last expression is shown.
Rich results (execbox_rich) are written under out/.execbox/results/, which the worker collects
with the output directory: the last expression's value, each display() call, and each matplotlib
figure shown with plt.show(). `changed` lists the files under out/ that the cell created or
modified (the artifacts of this call).
"""

import json
import os
import signal
import sys
import warnings

import execbox_rich

WORKDIR = "/workspace"
OUT = os.path.join(WORKDIR, "out")
RESERVED = os.path.join(OUT, ".execbox")
RESULT_FILE = os.path.join(RESERVED, "result.json")


def _snapshot():
    """(path relative to out/) -> (mtime_ns, size) for every regular file outside .execbox/."""
    seen = {}
    for root, dirs, files in os.walk(OUT):
        if root == OUT and ".execbox" in dirs:
            dirs.remove(".execbox")
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            seen[os.path.relpath(path, OUT)] = (st.st_mtime_ns, st.st_size)
    return seen


def _clear_reserved():
    try:
        os.unlink(RESULT_FILE)
    except OSError:
        pass
    execbox_rich.reset()
    helper = sys.modules.get("execbox")
    if helper is not None:  # imported by an earlier cell: its outputs and check are that cell's
        helper._reset()


def _shell():
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        """display(), and plt.show() through matplotlib's inline backend, land here."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            execbox_rich.publish("display_data", data)

        def clear_output(self, wait=False):
            pass

    class Hook(DisplayHook):
        """The last expression's value becomes a result (with `_`, `Out` as usual), not stdout text."""

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            execbox_rich.publish("execute_result", format_dict)

    shell = InteractiveShell.instance(colors="NoColor", display_pub_class=Publisher, displayhook_class=Hook)
    shell.history_manager.enabled = False

    def show_traceback(etype, evalue, stb):
        if issubclass(etype, SystemExit):  # an exit status, as a program's would be
            code = evalue.code
            if code is not None and not isinstance(code, int):
                sys.stderr.write("%s\n" % code)
            return
        sys.stderr.write(shell.InteractiveTB.stb2text(stb) + "\n")

    shell._showtraceback = show_traceback
    warnings.filterwarnings("ignore", message="To exit: use")
    return shell


def main():
    control = os.fdopen(0, "r", encoding="utf-8")
    report = os.fdopen(3, "w", encoding="utf-8")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # plt.show() displays each figure as image/png (the backend IPython kernels use).
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    shell = _shell()
    os.chdir(WORKDIR)
    report.write(json.dumps({"ready": True}) + "\n")
    report.flush()
    for line in control:
        request = json.loads(line)
        saved = {name: os.environ.get(name) for name in request.get("env", {})}
        os.environ.update(request.get("env", {}))
        _clear_reserved()
        before = _snapshot()
        status = 0
        try:
            result = shell.run_cell(request["code"], store_history=True)
            failure = result.error_before_exec or result.error_in_exec
            if isinstance(failure, SystemExit):
                code = failure.code
                status = code if isinstance(code, int) else (0 if code is None else 1)
            elif not result.success:
                status = 1
        except KeyboardInterrupt:  # arrived outside the cell's own code
            sys.stderr.write("KeyboardInterrupt\n")
            status = 130
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        after = _snapshot()
        changed = sorted(path for path, stat in after.items() if before.get(path) != stat)
        with warnings.catch_warnings():  # forking with threads about is the point: only this one goes on
            warnings.simplefilter("ignore", DeprecationWarning)
            copy = os.fork()
        if copy == 0:
            continue
        report.write(json.dumps({"id": request["id"], "status": status, "changed": changed, "kernel": copy}) + "\n")
        report.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
