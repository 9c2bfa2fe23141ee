"""The docs say what the code does: the config reference, every problem code and route, the rooms and rq's users."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import execbox
from execbox.api import create_app
from execbox.core.config_reference import render
from execbox.core.errors import ServiceError
from execbox.settings import Settings
from execbox.vocabulary import TABLES, section
from execbox.vocabulary import render as render_table

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service" / "execbox"
DOC = ROOT / "docs" / "operations.md"
API_DOC = ROOT / "docs" / "api.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"


def test_config_reference_is_current() -> None:
    text = DOC.read_text()
    start = text.index("<!-- config-reference:start -->\n") + len("<!-- config-reference:start -->\n")
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end] == render(Settings), "run scripts/config-reference"


def test_architecture_key_schema_and_error_tables_are_current() -> None:
    """docs/architecture.md's key-schema and error tables are what the rooms' keys.py and errors.py say."""
    text = ARCHITECTURE.read_text()
    for name in TABLES:
        start, end = section(text, name)
        assert text[start:end] == render_table(name), f"the {name} table is stale: run scripts/vocabulary-tables"


# -- problem codes ---------------------------------------------------------------------------------


def _error_classes() -> Iterator[type[ServiceError]]:
    """ServiceError and every subclass, wherever a room defines it (every module is imported first)."""
    for module in pkgutil.walk_packages(execbox.__path__, "execbox."):
        importlib.import_module(module.name)
    todo: list[type[ServiceError]] = [ServiceError]
    while todo:
        cls = todo.pop()
        yield cls
        todo.extend(cls.__subclasses__())


def _text(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _handler_codes() -> set[str]:
    """Codes the API's handlers write without a ServiceError: the literal `code` of each
    `problem_response(...)` or `_answer(request, ...)` call, the values of a status-to-code table
    and its `.get` default."""
    found: set[str | None] = set()
    for path in (SERVICE / "api").rglob("*.py"):
        tree = ast.parse(path.read_text())
        tables: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                keys = node.value.keys
                if keys and all(isinstance(k, ast.Constant) and isinstance(k.value, int) for k in keys):
                    tables.update(t.id for t in node.targets if isinstance(t, ast.Name))
                    found.update(_text(v) for v in node.value.values)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "problem_response":
                found.add(_text(node.args[1]))
            if isinstance(func, ast.Name) and func.id == "_answer" and len(node.args) > 2:  # (request, status, code)
                found.add(_text(node.args[2]))
            if isinstance(func, ast.Attribute) and func.attr == "get" and getattr(func.value, "id", None) in tables:
                found.add(_text(node.args[1]))
    return {code for code in found if code is not None}


def problem_codes() -> set[str]:
    return {cls.code for cls in _error_classes()} | _handler_codes()


def test_the_problem_codes_are_found() -> None:
    codes = problem_codes()
    # One of each source, so a change that stopped finding them would not pass as "nothing missing".
    assert {"execution.not_found", "request.malformed_json", "method_not_allowed", "http.error"} <= codes
    assert len(codes) >= 41


def test_every_problem_code_is_in_the_api_doc() -> None:
    text = API_DOC.read_text()
    missing = sorted(code for code in problem_codes() if f"`{code}`" not in text)
    assert missing == [], f"docs/api.md does not name these problem codes (write each as `code`): {missing}"


# -- routes ----------------------------------------------------------------------------------------

_PARAM = re.compile(r"\{[^}]*\}")


def _normal(path: str) -> str:
    """`/v1/runs/{run_id}` and `/v1/runs/{id}` are the same route to a reader."""
    return _PARAM.sub("{}", path)


def routes(settings: Settings) -> set[str]:
    """`METHOD /path` of every route the app answers (HEAD beside GET is Starlette's own), mounts as `/path`."""
    found: set[str] = set()
    pending = list(create_app(settings).routes)
    while pending:
        route = pending.pop(0)
        inner = getattr(route, "original_router", None)  # an included router: its routes, flattened
        if inner is not None:
            pending[:0] = list(inner.routes)
            continue
        path = _normal(str(getattr(route, "path", "")))
        methods = set(getattr(route, "methods", None) or ())
        if "GET" in methods:
            methods.discard("HEAD")
        found.update(f"{method} {path}" for method in methods)
        if not methods:
            found.add(path)
    return found


def test_the_routes_are_found(settings: Settings) -> None:
    found = routes(settings)
    assert {"POST /v1/executions", "GET /v1/executions/{}", "GET /healthz", "/mcp"} <= found
    assert len(found) >= 55


def test_every_route_is_in_the_api_doc(settings: Settings) -> None:
    text = _normal(" ".join(API_DOC.read_text().split()))  # a route may wrap onto the next line
    missing = []
    for route in sorted(routes(settings)):
        # the whole path: `GET /v1/runs` is not `GET /v1/runs/{}`
        if not re.search(re.escape(route) + r"(?![\w/{])", text):
            missing.append(route)
    assert missing == [], f"docs/api.md does not name these routes (as `METHOD /path`): {missing}"


# -- the rooms -------------------------------------------------------------------------------------


def rooms() -> list[Path]:
    return sorted(p for p in SERVICE.iterdir() if (p / "__init__.py").exists())


def test_the_readme_lists_every_room() -> None:
    text = README.read_text()
    layout = text[text.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1) if "\n## " in layout[1:] else len(layout)]
    assert [r.name for r in rooms() if f"`{r.name}/`" not in layout] == []


def test_the_architecture_rooms_table_names_every_module() -> None:
    """Each room's row names each of its modules (`name`) and sub-packages (`name/`)."""
    text = ARCHITECTURE.read_text()
    missing = []
    for room in rooms():
        row = re.search(rf"^\| `{room.name}/` \|(.*)$", text, re.MULTILINE)
        if row is None:
            missing.append(f"{room.name}/ (no row)")
            continue
        for path in sorted(room.iterdir()):
            if path.suffix == ".py" and path.stem != "__init__" and f"`{path.stem}`" not in row.group(1):
                missing.append(f"{room.name}/{path.name}")
            if (path / "__init__.py").exists() and f"`{path.name}/" not in row.group(1):
                missing.append(f"{room.name}/{path.name}/")
    assert missing == [], f"docs/architecture.md's rooms table does not name: {missing}"


def test_the_queue_docstring_names_every_module_that_imports_rq() -> None:
    """executions/queue.py says who else imports rq; the list stays true."""
    docstring = ast.get_docstring(ast.parse((SERVICE / "executions" / "queue.py").read_text())) or ""
    importers = []
    for path in sorted(SERVICE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n == "rq" or n.startswith("rq.") for n in names):
                importers.append(path.relative_to(SERVICE).as_posix())
                break
    assert "executions/queue.py" in importers
    assert [m for m in importers if m != "executions/queue.py" and f"`{m}`" not in docstring] == []
