"""execbox one-shot Python runner: `python3 oneshot.py main.py` runs main.py as `python3 main.py`
would (as __main__, its directory first on sys.path, the same tracebacks and exit status), and
shows the value of its last top-level expression as a rich result (execbox_rich), as a notebook
cell would. plt.show() is made a result by the image's matplotlib backend (execbox_show).
"""

import _ast  # the compiler's own node types: `import ast` would cost ~4 ms on every run
import os
import sys


def _report(exc: BaseException) -> None:
    """Hand an uncaught exception to sys.excepthook as the interpreter would, without this
    runner's frames (a program's own hook still sees it)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def main() -> int:
    path = os.path.abspath(sys.argv[1])  # as the interpreter names a script it runs
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(path)
    with open(path, "rb") as f:
        source = f.read()
    namespace: dict[str, object] = {
        "__name__": "__main__",
        "__file__": path,
        "__builtins__": __builtins__,
        "__doc__": None,
    }
    try:
        tree = compile(source, path, "exec", _ast.PyCF_ONLY_AST)
        assert isinstance(tree, _ast.Module)
        last = None
        if tree.body and isinstance(final := tree.body[-1], _ast.Expr):
            tree.body.pop()
            last = _ast.Expression(final.value)
        exec(compile(tree, path, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, path, "eval"), namespace)
            if value is not None:
                import execbox_rich

                execbox_rich.publish("execute_result", execbox_rich.represent(value))
    except SystemExit:
        raise
    except BaseException as exc:
        _report(exc)
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
