"""execbox session kernel: one IPython interpreter that runs a session's cells in turn.

Started by the session supervisor (session.py), never by the worker directly. Its fd 0 carries
the supervisor's requests (one JSON object per line: {"id", "code", "env"}), fd 1 and 2 are pipes
to the supervisor (the cell's stdout and stderr), and fd 3 is where it reports each cell's end
(one JSON line: {"id", "status", "changed"}).

The cell runs through IPython's run_cell, so the interpreter keeps its variables, imports and
loaded data from one cell to the next, and the value of a cell's last expression is shown.
Rich results are written as files under out/.execbox/results/ (the worker collects them with the
output directory): one JSON index plus one file per representation, for the last expression's
value, each display() call, and each matplotlib figure shown with plt.show(). `changed` lists
the files under out/ that the cell created or modified (the artifacts of this call).
"""

import base64
import json
import os
import signal
import sys
import warnings

WORKDIR = "/workspace"
OUT = os.path.join(WORKDIR, "out")
RESERVED = os.path.join(OUT, ".execbox")
RESULTS = os.path.join(RESERVED, "results")
RESULT_FILE = os.path.join(RESERVED, "result.json")
MIME_FILES = {
    "text/plain": "txt",
    "text/html": "html",
    "text/markdown": "md",
    "text/latex": "tex",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/svg+xml": "svg",
    "application/json": "json",
}
"""The representations kept, and the file extension each is stored under."""

_results = []
"""The current cell's rich results, in order: (kind, {mime: data})."""


def _publish(kind, data):
    kept = {mime: value for mime, value in data.items() if mime in MIME_FILES}
    if kept:
        _results.append((kind, kept))


def _write_results():
    os.makedirs(RESULTS, exist_ok=True)
    index = []
    for n, (kind, data) in enumerate(_results):
        files = {}
        for mime, value in data.items():
            name = "%d.%s" % (n, MIME_FILES[mime])
            if mime.startswith("image/") and mime != "image/svg+xml":
                raw = base64.b64decode(value) if isinstance(value, str) else bytes(value)
            elif mime == "application/json":
                raw = json.dumps(value).encode()
            else:
                raw = str(value).encode("utf-8", "replace")
            with open(os.path.join(RESULTS, name), "wb") as f:
                f.write(raw)
            files[mime] = name
        index.append({"kind": kind, "files": files})
    with open(os.path.join(RESULTS, "index.json"), "w") as f:
        json.dump(index, f)


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
    for path in (RESULT_FILE,):
        try:
            os.unlink(path)
        except OSError:
            pass
    if os.path.isdir(RESULTS):
        for name in os.listdir(RESULTS):
            try:
                os.unlink(os.path.join(RESULTS, name))
            except OSError:
                pass


def _shell():
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Publisher(DisplayPublisher):
        """display(), and plt.show() through matplotlib's inline backend, land here."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            _publish("display_data", data)

        def clear_output(self, wait=False):
            pass

    class Hook(DisplayHook):
        """The last expression's value becomes a result (with `_`, `Out` as usual), not stdout text."""

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            _publish("execute_result", format_dict)

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
        del _results[:]
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
        try:
            if _results:
                _write_results()
        except OSError as exc:
            sys.stderr.write("execbox: could not store the cell's rich results: %s\n" % exc)
        after = _snapshot()
        changed = sorted(path for path, stat in after.items() if before.get(path) != stat)
        report.write(json.dumps({"id": request["id"], "status": status, "changed": changed}) + "\n")
        report.flush()


if __name__ == "__main__":
    main()
