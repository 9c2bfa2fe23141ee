"""docs/architecture.md's key-schema and error tables, rendered from the rooms so the two never disagree.

Each room names its Redis keys (`<room>/keys.py`) and its errors (`<room>/errors.py`); this module
reads them where they are defined and renders one table of each between markers in the document.
`scripts/vocabulary-tables` writes them; tests/unit/test_docs.py fails when the document is stale.
It sits beside `execbox.keyschema`, above the rooms; no process imports it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import execbox
from execbox.core.errors import ServiceError
from execbox.keyschema import ROOM_SCHEMAS

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
TABLES = ("key-schema", "errors")
"""The marker names: `<!-- {name}:start -->` ... `<!-- {name}:end -->`."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def key_table() -> str:
    """Every key after the deployment's prefix `{p}:`, by the room that owns it."""
    rows = ["| key (after `{p}:`) | room | type | lifetime | written by | read by | what |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for room, schema in ROOM_SCHEMAS.items():
        for spec in schema:
            rows.append(
                f"| `{spec.pattern}` | {room} | {_cell(spec.type)} | {_cell(spec.ttl)} | {', '.join(spec.write)} "
                f"| {', '.join(spec.read) or '-'} | {_cell(spec.what)} |"
            )
    return "\n".join(rows) + "\n"


def _error_modules() -> None:
    """Import every module, so each ServiceError subclass is defined (one outside a room's `errors`
    shows up in the table where it is, rather than hiding)."""
    for info in pkgutil.walk_packages(execbox.__path__, "execbox."):
        if info.name != __name__:
            importlib.import_module(info.name)


def _tree(cls: type[ServiceError], depth: int = 0) -> Iterator[tuple[int, type[ServiceError]]]:
    yield depth, cls
    for sub in sorted(cls.__subclasses__(), key=lambda c: (c.__module__ != "execbox.core.errors", c.code, c.__name__)):
        if sub.__module__.startswith("execbox."):  # tests may subclass too
            yield from _tree(sub, depth + 1)


def error_table() -> str:
    """The whole ServiceError tree, depth first: each class under its base, where it is defined."""
    _error_modules()
    rows = ["| error | code | HTTP | retryable | defined in |", "|---|---|---|---|---|"]
    for depth, cls in _tree(ServiceError):
        name = "· " * depth + f"`{cls.__name__}`"
        where = cls.__module__.removeprefix("execbox.")
        rows.append(f"| {name} | `{cls.code}` | {cls.http_status} | {'yes' if cls.retryable else 'no'} | `{where}` |")
    return "\n".join(rows) + "\n"


def render(name: str) -> str:
    return {"key-schema": key_table, "errors": error_table}[name]()


def section(text: str, name: str) -> tuple[int, int]:
    """Where the generated table `name` sits in `text` (start and end offsets)."""
    start_marker = f"<!-- {name}:start -->\n"
    start = text.index(start_marker) + len(start_marker)
    return start, text.index(f"<!-- {name}:end -->")


def write(doc: Path = DOC) -> None:
    text = doc.read_text()
    for name in TABLES:
        start, end = section(text, name)
        text = text[:start] + render(name) + text[end:]
    doc.write_text(text)


if __name__ == "__main__":
    write()
