"""Rich results from inside a Python sandbox (standard library only).

Each result is written when it is shown, under out/.execbox/results/: one file per
representation and an index (index.json) of the results in order, which the service collects
with the output directory. Used by the session kernel (kernel.py), the one-shot runner
(oneshot.py) and the matplotlib backend that turns plt.show() into PNG results (execbox_show).
"""

import json
import os

RESULTS = os.path.join(os.environ.get("EXECBOX_OUTPUT_DIR", "/workspace/out"), ".execbox", "results")
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
_REPR_METHODS = {
    "text/html": "_repr_html_",
    "text/markdown": "_repr_markdown_",
    "text/latex": "_repr_latex_",
    "image/png": "_repr_png_",
    "image/jpeg": "_repr_jpeg_",
    "image/svg+xml": "_repr_svg_",
    "application/json": "_repr_json_",
}
_index: list[dict[str, object]] = []


def reset() -> None:
    """Forget the results shown so far and remove their files (a session's next call)."""
    del _index[:]
    if os.path.isdir(RESULTS):
        for name in os.listdir(RESULTS):
            try:
                os.unlink(os.path.join(RESULTS, name))
            except OSError:
                pass


def represent(value: object) -> dict[str, object]:
    """text/plain and whatever the object offers through the _repr_*_ protocol (IPython's)."""
    data: dict[str, object] = {"text/plain": repr(value)}
    for mime, method in _REPR_METHODS.items():
        render = getattr(type(value), method, None)
        if render is None:
            continue
        try:
            shown = render(value)
        except Exception:
            continue
        if isinstance(shown, tuple):  # (data, metadata)
            shown = shown[0]
        if shown is not None:
            data[mime] = shown
    return data


def publish(kind: str, data: dict[str, object]) -> None:
    """Write one result (kind: execute_result or display_data; data: {mime: str | bytes | JSON})."""
    kept = {mime: value for mime, value in data.items() if mime in MIME_FILES}
    if not kept:
        return
    os.makedirs(RESULTS, exist_ok=True)
    n = len(_index)
    files: dict[str, str] = {}
    for mime, value in kept.items():
        name = f"{n}.{MIME_FILES[mime]}"
        if mime == "application/json":
            raw = json.dumps(value, default=repr).encode()
        elif isinstance(value, bytes):
            raw = value
        elif mime.startswith("image/") and mime != "image/svg+xml":
            import base64

            raw = base64.b64decode(str(value))
        else:
            raw = str(value).encode("utf-8", "replace")
        with open(os.path.join(RESULTS, name), "wb") as f:
            f.write(raw)
        files[mime] = name
    _index.append({"kind": kind, "files": files})
    partial = os.path.join(RESULTS, "index.json.partial")
    with open(partial, "w") as f:
        json.dump(_index, f)
    os.replace(partial, os.path.join(RESULTS, "index.json"))


def display(value: object) -> None:
    """Show a value as a result (display_data), with every representation it has."""
    publish("display_data", represent(value))
