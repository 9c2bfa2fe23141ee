"""The docs say what the code does: the config reference, every problem code and route, the rooms and rq's users,
the statuses, the MCP tools, what `make unit` needs and the headers each route sends."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from execbox_client.mcp import build
from mcp.server.fastmcp import FastMCP

import execbox
from execbox.api import create_app
from execbox.core.config_reference import render
from execbox.core.errors import ServiceError
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.settings import Settings
from execbox.vocabulary import TABLES, section
from execbox.vocabulary import render as render_table
from tests.unit.conftest import InProcess, make_record

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service" / "execbox"
DOC = ROOT / "docs" / "operations.md"
API_DOC = ROOT / "docs" / "api.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
CLIENT_README = ROOT / "clients" / "python" / "README.md"
INSTALL = ROOT / "scripts" / "install"


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


# -- the README's lists ----------------------------------------------------------------------------


def _item(text: str, opening: str) -> str:
    """The list item or paragraph that begins with `opening`, up to the next item or blank line."""
    start = text.index(opening)
    ends = [end for end in (text.find("\n- ", start + 1), text.find("\n\n", start)) if end != -1]
    return text[start : min(ends, default=len(text))]


def test_the_readme_names_every_execution_status() -> None:
    lifecycle = _item(README.read_text(), "- Lifecycle")
    named = {word for span in re.findall(r"`([^`]*)`", lifecycle) for word in re.findall(r"[a-z_]+", span)}
    assert [s.value for s in ExecutionStatus if s.value not in named] == [], "README's lifecycle misses statuses"


def mcp_tools() -> set[str]:
    """The tools the MCP endpoint offers: execbox_client.mcp.build, which the API mounts at /mcp."""

    def connect(ctx: Any) -> Any:
        raise AssertionError("no tool is called")

    server = build(FastMCP("execbox"), connect)
    return {tool.name for tool in asyncio.run(server.list_tools())}


def test_the_mcp_tools_are_found() -> None:
    tools = mcp_tools()
    assert {"run_code", "get_run", "decide_approval", "invoke_script"} <= tools
    assert len(tools) >= 21


def test_the_readme_lists_the_mcp_tools() -> None:
    listed = _item(README.read_text(), "- **An MCP client**").split("Tools:")[1]
    assert set(re.findall(r"[a-z_]+", listed)) == mcp_tools()


def test_the_api_doc_names_every_mcp_tool() -> None:
    text = API_DOC.read_text()
    mcp = text[text.index("## /mcp") : text.index("\n## ", text.index("## /mcp") + 1)]
    assert sorted(tool for tool in mcp_tools() if f"`{tool}`" not in mcp) == []


# -- what make unit needs --------------------------------------------------------------------------

_ON_EVERY_DEBIAN = {"sh", "bash"}
_RUNS = {"run", "Popen", "call", "check_call", "check_output"}


def unit_tier_commands() -> set[str]:
    """The commands the unit tier looks up (`shutil.which("name")`) or runs (a literal argv given to
    subprocess), in tests/unit and the conftest above it."""
    found: set[str | None] = set()
    for path in [ROOT / "tests" / "conftest.py", *sorted((ROOT / "tests" / "unit").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            owner, name, first = getattr(node.func.value, "id", None), node.func.attr, node.args[0]
            if owner == "shutil" and name == "which":
                found.add(_text(first))
            if owner == "subprocess" and name in _RUNS and isinstance(first, ast.List) and first.elts:
                found.add(_text(first.elts[0]))
    return {command for command in found if command is not None} - _ON_EVERY_DEBIAN


def test_the_unit_tier_commands_are_found() -> None:
    assert {"redis-server", "bwrap", "kustomize"} <= unit_tier_commands()


def test_the_readme_says_what_make_unit_needs() -> None:
    """Each command the unit tier needs is named where the README says what `make unit` needs, and
    scripts/install installs it unless the README names it as another's alternative."""
    needs = _item(README.read_text(), "`make unit`")
    installed = set(re.findall(r"command -v ([\w-]+)", INSTALL.read_text()))
    commands = unit_tier_commands()
    assert sorted(c for c in commands if f"`{c}`" not in needs) == [], "README: add it to what make unit needs"
    assert sorted(c for c in commands if c not in installed and f"(or `{c}`)" not in needs) == []


# -- headers per route -----------------------------------------------------------------------------

_HEADERS = ("X-Trace-Id", "traceparent", "Idempotent-Replayed", "RateLimit-*")
_COLUMNS = ("every", "new", "replay")


def _header(name: str) -> str | None:
    """The name a header has in the docs' table (`RateLimit-*` for the three), or None when the
    table does not list it."""
    name = "RateLimit-*" if name.lower().startswith("ratelimit-") else name
    return next((h for h in _HEADERS if h.lower() == name.lower()), None)


def documented_headers() -> dict[str, dict[str, set[str]]]:
    """docs/api.md's *Response headers* table: route → column (every, new, replay) → headers."""
    text = API_DOC.read_text()
    start = text.index("## Response headers")
    table: dict[str, dict[str, set[str]]] = {}
    for row in re.findall(r"^\| `([A-Z]+ /[^`]*)` \|(.*)\|$", text[start : text.index("\n## ", start)], re.M):
        cells = row[1].split("|")
        table[_normal(row[0])] = {c: set(re.findall(r"`([^`]+)`", x)) for c, x in zip(_COLUMNS, cells, strict=True)}
    return table


def _sent_statically(function: Callable[..., Any]) -> set[str]:
    """The table's headers a route function sets: `response.headers["H"] = ...`, `headers={"H": ...}`,
    `response.headers.update(submitted.headers)` (an admission's RateLimit-*), and the same in the
    functions it calls of its module, or of a module it imports whole (`answers.submitted`)."""

    def functions_of(module: Any, prefix: str = "") -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        tree = ast.parse(Path(inspect.getsourcefile(module) or "").read_text())
        return {prefix + n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    home = sys.modules[function.__module__]
    functions = functions_of(home)
    for name, value in vars(home).items():
        if inspect.ismodule(value) and value.__name__.startswith("execbox.api."):
            functions.update(functions_of(value, f"{name}."))
    sent: set[str | None] = set()
    todo, seen = [function.__name__], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) == "headers":
                if isinstance(node.ctx, ast.Store):
                    sent.add(_header(_text(node.slice) or ""))
            if isinstance(node, ast.keyword) and node.arg == "headers" and isinstance(node.value, ast.Dict):
                sent.update(_header(_text(key) or "") for key in node.value.keys if key is not None)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
                if getattr(node.func.value, "attr", None) == "headers":
                    sent.add("RateLimit-*")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):  # a helper such as `_stream`
                todo.append(name[: name.rfind(".") + 1] + node.func.id)  # of the module `name` is in
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # such as `answers.execution`
                if isinstance(node.func.value, ast.Name):
                    todo.append(f"{node.func.value.id}.{node.func.attr}")
    return {header for header in sent if header is not None}


def test_every_v1_route_that_sends_a_listed_header_is_in_the_headers_table(settings: Settings) -> None:
    """A route that starts sending one of the table's headers gets a row, read from its code; the
    test below then checks each row against what the route sends."""
    table = documented_headers()
    found: dict[str, set[str]] = {}
    for route in create_app(settings).routes:
        for inner in getattr(getattr(route, "original_router", None), "routes", [route]):
            path, endpoint = _normal(str(getattr(inner, "path", ""))), getattr(inner, "endpoint", None)
            if path.startswith("/v1/") and endpoint is not None:
                for method in getattr(inner, "methods", None) or ():
                    if sent := _sent_statically(endpoint):
                        found[f"{method} {path}"] = sent
    assert {"POST /v1/executions", "POST /v1/scripts/{}/invoke", "POST /v1/runs"} <= set(found)
    documented = {route: set().union(*columns.values()) for route, columns in table.items()}
    assert {route: found[route] for route in found if documented.get(route) != found[route]} == {}
    assert sorted(set(table) - set(found)) == [], "rows for routes that send none of these headers"


Api = tuple[InProcess, dict[str, dict[str, str]]]
PROGRAM = {"language": "python", "code": "print(1)"}
Answers = tuple[httpx.Response, httpx.Response | None]
"""A route's first answer and, for a route that takes an Idempotency-Key, the answer to its retry."""
Request = Callable[[InProcess, dict[str, str], Settings, redis.Redis], Answers]


def _created(http: InProcess, auth: dict[str, str]) -> str:
    execution_id: str = http.post("/v1/executions", json=PROGRAM, headers=auth).json()["id"]
    return execution_id


def _execution_route(suffix: str, method: str = "POST", **kwargs: Any) -> Request:
    def send(http: InProcess, auth: dict[str, str], settings: Settings, client: redis.Redis) -> Answers:
        if suffix == "/reconcile":  # only an unknown outcome is reconciled
            record = make_record(settings)
            record.status = ExecutionStatus.UNKNOWN_OUTCOME
            ExecutionStore(client, settings).create(record)
            execution_id = record.id
        else:
            execution_id = _created(http, auth)
        url = f"/v1/executions/{execution_id}{suffix}"
        return (http.get(url, headers=auth) if method == "GET" else http.post(url, headers=auth, **kwargs)), None

    return send


def _keyed(url: str, **kwargs: Any) -> Request:
    def send(http: InProcess, auth: dict[str, str], settings: Settings, client: redis.Redis) -> Answers:
        keyed = {**auth, "Idempotency-Key": "docs-headers"}
        return http.post(url, headers=keyed, **kwargs), http.post(url, headers=keyed, **kwargs)

    return send


def _invoked(http: InProcess, auth: dict[str, str], settings: Settings, client: redis.Redis) -> Answers:
    script = {"name": "docs.hello", "version": "1.0.0", "language": "python", "code": "print(1)"}
    assert http.post("/v1/scripts", json=script, headers=auth).status_code == 201
    return _keyed("/v1/scripts/docs.hello/invoke", json={"version": "1.0.0", "inputs": {}})(
        http, auth, settings, client
    )


REQUESTS: dict[str, Request] = {
    "POST /v1/executions": _keyed("/v1/executions", json=PROGRAM),
    "GET /v1/executions/{}": _execution_route("", "GET"),
    "GET /v1/executions/{}/record": _execution_route("/record", "GET"),
    "POST /v1/executions/{}/cancel": _execution_route("/cancel"),
    "POST /v1/executions/{}/reconcile": _execution_route("/reconcile", json={"outcome": "not_applied", "reason": "x"}),
    "POST /v1/scripts/{}/invoke": _invoked,
    "POST /v1/files": _keyed("/v1/files", files={"file": ("a.txt", b"a")}),
    "POST /v1/runs": _keyed("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [{"id": "a", "run": PROGRAM}]}}),
}


def _sent(answer: httpx.Response) -> set[str]:
    assert answer.is_success, answer.text
    return {header for header in map(_header, answer.headers.keys()) if header is not None}


def test_every_row_of_the_headers_table_has_a_request() -> None:
    assert sorted(documented_headers()) == sorted(REQUESTS)


@pytest.mark.redis
@pytest.mark.parametrize("route", sorted(REQUESTS))
def test_each_route_sends_the_headers_the_api_doc_says(
    route: str, api: Api, settings: Settings, client: redis.Redis
) -> None:
    http, headers = api
    first, replay = REQUESTS[route](http, headers["alpha"], settings, client)
    sent = _sent(first)
    again = _sent(replay) if replay is not None else sent
    observed = {"every": sent & again, "new": sent - again, "replay": again - sent}
    assert observed == documented_headers().get(route), f"docs/api.md, *Response headers*, row `{route}`"
