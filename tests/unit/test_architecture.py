"""The layout rules of docs/architecture.md that the import linter (scripts/check) does not see."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from execbox.core.redis_roles import roles
from execbox.keyschema import LOOPS, SCHEMA, Keys
from execbox.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service" / "execbox"
LONG_MODULE_LINES = 400
LONG_REASON = "Longer than 400 lines because"


def _package(module: str) -> str:
    """The room a module belongs to: execbox.<room>, or the test tree."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "execbox" else parts[0]


def _modules(base: Path, prefix: str) -> list[tuple[str, Path]]:
    found = []
    for path in sorted(base.rglob("*.py")):
        relative = path.relative_to(base).with_suffix("")
        module = ".".join((prefix, *relative.parts)).removesuffix(".__init__")
        found.append((module, path))
    return found


def private_imports_across_rooms() -> list[str]:
    """`from execbox.<room>... import _name` written outside that room (tests included)."""
    offenders = []
    for module, path in (
        _modules(SERVICE, "execbox") + _modules(ROOT / "tests", "tests") + _modules(ROOT / "bench", "bench")
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("execbox"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and _package(node.module) != _package(module):
                    offenders.append(f"{module} imports {', '.join(private)} from {node.module}")
    return offenders


def test_no_private_name_is_imported_across_rooms() -> None:
    assert private_imports_across_rooms() == []


def test_long_modules_say_why_at_their_top() -> None:
    unexplained = []
    for module, path in _modules(SERVICE, "execbox"):
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > LONG_MODULE_LINES and LONG_REASON not in docstring:
            unexplained.append(f"{module}: {len(text.splitlines())} lines")
    assert unexplained == []


def test_every_room_says_what_it_holds() -> None:
    rooms = [p for p in SERVICE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert rooms, SERVICE
    assert [r.name for r in rooms if not ast.get_docstring(ast.parse((r / "__init__.py").read_text()))] == []


def test_every_role_that_uses_a_key_may_reach_it() -> None:
    """The key schema and the Redis roles agree: each role named as a key's writer or reader has a
    pattern covering it (with write rights for writers)."""
    import fnmatch

    granted = roles("p", SCHEMA)
    keys = Keys("p")
    missing = []
    for spec in SCHEMA:
        key = f"p:{spec.pattern}".replace("{", "").replace("}", "")
        for role, needs in [(r, "write") for r in spec.write] + [(r, "read") for r in spec.read]:
            patterns = [*granted[role].keys, *(f"~{c}" for c in granted[role].channels)]
            ok = [p for p in patterns if fnmatch.fnmatchcase(key, p.lstrip("%RW~"))]
            if not ok or (needs == "write" and all(p.startswith("%R~") for p in ok)):
                missing.append(f"{role} cannot {needs} {spec.pattern}")
    assert missing == []
    assert keys.pattern("worker") == "p:worker:*"


def test_default_paths_point_into_the_repository() -> None:
    settings = Settings()
    assert (settings.policies_dir / "default.yaml").is_file()
    assert (settings.images_dir / "python").is_dir()


def test_every_rooms_keys_are_in_the_assembled_schema() -> None:
    """A room's `keys.py` is part of the schema only once `execbox.keyschema` lists its table and its
    class: each room's SCHEMA is in ROOM_SCHEMAS and each room's key class is one of Keys' bases."""
    import importlib

    from execbox.core.keys import KeyBuilder
    from execbox.keyschema import ROOM_SCHEMAS

    missing = []
    for path in sorted(SERVICE.glob("*/keys.py")):
        room = path.parent.name
        module = importlib.import_module(f"execbox.{room}.keys")
        if room != "core" and ROOM_SCHEMAS.get(room) is not getattr(module, "SCHEMA", None):
            missing.append(f"{room}: SCHEMA not in keyschema.ROOM_SCHEMAS")
        for value in vars(module).values():
            owned = isinstance(value, type) and issubclass(value, KeyBuilder) and value.__module__ == module.__name__
            if owned and not issubclass(Keys, value):
                missing.append(f"{room}: {value.__name__} is not a base of keyschema.Keys")
    assert missing == []
    assert len({spec.pattern for spec in SCHEMA}) == len(SCHEMA), "a key pattern named by two rooms"


def test_every_rooms_settings_section_is_in_the_root() -> None:
    """A room's `settings.py` section reaches the environment only once `execbox.settings.Settings` has a
    field of its type (a nested model, like the pool's classes, counts once its section is there)."""
    import importlib

    from pydantic import BaseModel

    def types(model: type[BaseModel]) -> set[type]:
        found: set[type] = set()
        for field in model.model_fields.values():
            for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
                if isinstance(arg, type) and issubclass(arg, BaseModel) and arg not in found:
                    found |= {arg, *types(arg)}
        return found

    reachable = types(Settings)
    missing = []
    for path in sorted(SERVICE.glob("*/settings.py")):
        module = importlib.import_module(f"execbox.{path.parent.name}.settings")
        for value in vars(module).values():
            owned = isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__
            if owned and value.__name__ != "SettingsRoot" and value not in reachable:
                missing.append(f"{module.__name__}.{value.__name__}")
    assert missing == [], f"sections no field of execbox.settings.Settings holds: {missing}"


def service_calls() -> Iterator[tuple[str, ast.Call, str, str]]:
    """Every call in the service's code: its module, the node, the name called and what it is called on."""
    for module, path in _modules(SERVICE, "execbox"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
                yield module, node, name, receiver


def loop_names_used() -> dict[str, str]:
    """Each loop name the service's code gives a guard (`Guard(client, keys, "<loop>", ...)`), starts
    under a supervisor (`loops.start("<loop>", ...)`) or counts poison under, with where."""
    used = {}
    for module, node, name, receiver in service_calls():
        literal: ast.expr | None = None
        if name == "Guard" and len(node.args) >= 3:
            literal = node.args[2]
        elif name == "start" and "loops" in receiver and node.args:
            literal = node.args[0]
        elif name == "labels" and "poison" in receiver and node.args:
            literal = node.args[0]
        if isinstance(literal, ast.Constant) and isinstance(literal.value, str):
            used[literal.value] = f"{module}:{node.lineno}"
    return used


def consumer_groups_named() -> dict[str, int]:
    """Each consumer the service's code names an outbox group for, with how many arguments it gives
    (2: per queue); a name that is not a literal could be anything, and is named by where it is."""
    named = {}
    for module, node, name, _ in service_calls():
        if name == "consumer_group":
            given = [*node.args, *(k.value for k in node.keywords)]
            first = given[0] if given else None
            named[
                str(first.value if isinstance(first, ast.Constant) else f"<not a literal: {module}:{node.lineno}>")
            ] = len(given)
    return named


def test_every_loop_the_code_runs_is_one_a_room_declares() -> None:
    """A loop's name is its `loop` label, its dead-letter stream and what `execbox dead-letters`
    lists: a room declares it in its keys.py (`LOOPS`), and `execbox.keyschema.LOOPS` gathers them."""
    used = loop_names_used()

    assert {"plans", "scheduler", "surprises", "webhooks", "reaper", "sessions"} <= used.keys(), used
    assert {name: where for name, where in used.items() if name not in LOOPS} == {}
    assert len(set(LOOPS)) == len(LOOPS), LOOPS


def test_every_consumer_group_is_a_declared_loop_and_only_plans_is_read_per_queue() -> None:
    """A durable consumer of the outbox is one of its room's loops; its group is the loop's name."""
    named = consumer_groups_named()

    assert named == {"webhooks": 1, "plans": 2, "surprises": 1}, named
    assert named.keys() <= set(LOOPS), LOOPS
