"""Figures of issue 29's "Done when", for a tree given as argument (a checkout of any commit):

1. lines in service/execbox/worker/ (every line of its .py files, as `wc -l` counts them);
2. cross-room calls for one execution: each call site from one room's module into another room's
   name, on the path the worker's job function takes;
3. rooms touched per commit since a given commit (`git log --name-only`).

    .venv/bin/python bench/architecture_figures.py /work/wt-old --since 555822a
    .venv/bin/python bench/architecture_figures.py . --entry execbox.worker.tasks:run_next \\
        --follow worker --follow executions/lifecycle.py --since 7b2f33a

How (2) is counted, by reading the code (ast), not by running it. A room is a folder under
service/execbox/ (api, core, executions, ...). The walk starts at the entry function and goes into
each function or method it calls that is defined in a followed module (every module under the
followed folders and the named files: by default worker/ and, where they exist, the lifecycle
modules executions/lifecycle.py and executions/outcome.py), and from there on, transitively. In
each function walked, every call site (`ast.Call`, nested functions and lambdas included) whose
target resolves to a name defined in another room is counted once: a call `f(...)` of an imported
function or class, `module.f(...)`, and a method call `x.y.m(...)` whose receiver's class is known
from annotations (parameters, `self`, class and dataclass fields, `self.x: T`, return types) or
from a local `x = Class(...)` (a method the class inherits from a third-party base, such as
pydantic's `model_copy`, counts as the class's), and `Class.method(...)`. Calls into the caller's
own room, into the standard library or third-party packages, and calls whose receiver's class the
annotations do not give are not counted (the script prints how many method calls it could not
type). Calls made inside another room's code are not followed unless that module is followed:
the count is the worker's (and the lifecycle's) crossings, as the issue counts them. The worker's
process setup (`--skip`; by default the context's `current`, `WorkerContext.build` and
`build_pool`) runs once per process, not per execution, and is not walked.

Against the issue's own figures at 555822a: 1,568 lines in worker/ and 21 of 51 commits since the
rooms (caa93cf) touching core/ are reproduced exactly; its hand count of crossings (executions 12,
files 6, sandbox 5) is of the same order as this one's calls without constructors, not identical.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "execbox"


@dataclass
class ClassInfo:
    module: str
    name: str
    fields: dict[str, ast.expr] = field(default_factory=dict)  # name -> annotation, or the call that made it
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    bases: list[ast.expr] = field(default_factory=list)


@dataclass
class Module:
    name: str
    room: str
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "execbox.core.keys.Keys" or a module
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "(top)"


def load(service: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((service / PACKAGE).rglob("*.py")):
        parts = path.relative_to(service).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = Module(name, room_of(name), ast.parse(path.read_text(), str(path)))
        package = name if parts[-1] == "__init__" else name.rsplit(".", 1)[0]
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    module.imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        for node in module.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                module.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                module.classes[node.name] = _class(name, node)
        modules[name] = module
    return modules


def _class(module: str, node: ast.ClassDef) -> ClassInfo:
    info = ClassInfo(module, node.name, bases=list(node.bases))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            info.fields[item.target.id] = item.annotation
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            info.methods[item.name] = item
            if item.returns is not None and any(
                isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
            ):
                info.fields[item.name] = item.returns
    for method in info.methods.values():
        params = {a.arg: a.annotation for a in method.args.args + method.args.kwonlyargs if a.annotation is not None}
        for sub in ast.walk(method):
            target = (
                sub.target
                if isinstance(sub, ast.AnnAssign)
                else (sub.targets[0] if isinstance(sub, ast.Assign) and len(sub.targets) == 1 else None)
            )
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                if isinstance(sub, ast.AnnAssign):
                    info.fields.setdefault(target.attr, sub.annotation)
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id in params:
                    info.fields.setdefault(target.attr, params[sub.value.id])
                elif isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
                    info.fields.setdefault(target.attr, sub.value.func)
    return info


class Resolver:
    """Names and annotations to the module-level thing they denote ("execbox.x.y.Name")."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules

    def lookup(self, dotted: str) -> tuple[Module, str] | None:
        """The module that defines `dotted`'s last part (following re-exports), and that name."""
        for _ in range(10):
            module_name, _, name = dotted.rpartition(".")
            module = self.modules.get(module_name)
            if module is None:
                return None
            if name in module.functions or name in module.classes:
                return module, name
            if name in module.imports:
                dotted = module.imports[name]
                continue
            return None
        return None

    def name_in(self, module: Module, name: str) -> str | None:
        if name in module.functions or name in module.classes:
            return f"{module.name}.{name}"
        return module.imports.get(name)

    def annotation_class(self, module: Module, annotation: ast.expr | None) -> ClassInfo | None:
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.BinOp):  # X | None
            return self.annotation_class(module, annotation.left) or self.annotation_class(module, annotation.right)
        if isinstance(annotation, ast.Subscript):  # Optional[X], ClassVar[X]
            return self.annotation_class(module, annotation.slice)
        dotted = self.dotted(module, annotation)
        found = self.lookup(dotted) if dotted else None
        if found and found[1] in found[0].classes:
            return found[0].classes[found[1]]
        return None

    def dotted(self, module: Module, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.name_in(module, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(module, node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def field_class(self, cls: ClassInfo, attr: str) -> ClassInfo | None:
        owner = self.modules[cls.module]
        if attr in cls.fields:
            return self.annotation_class(owner, cls.fields[attr])
        for base in cls.bases:
            parent = self.annotation_class(owner, base)
            if parent is not None:
                found = self.field_class(parent, attr)
                if found is not None:
                    return found
        return None

    def method(self, cls: ClassInfo, name: str) -> tuple[ClassInfo, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        if name in cls.methods:
            return cls, cls.methods[name]
        for base in cls.bases:
            parent = self.annotation_class(self.modules[cls.module], base)
            if parent is not None and (found := self.method(parent, name)):
                return found
        return None


@dataclass(frozen=True)
class Site:
    caller: str
    line: int
    target: str
    room: str
    kind: str  # function, method, or class (a constructor)


SETUP = (
    "execbox.worker.context.current",
    "execbox.worker.context.WorkerContext.build",
    "execbox.worker.context.build_pool",
)
"""Not walked by default: the worker's process setup (the context is built once, on its first job)."""


def walk(
    modules: dict[str, Module], entry: str, followed: set[str], skip: tuple[str, ...] = SETUP
) -> tuple[list[Site], list[str], int]:
    """The cross-room call sites on the entry's path, the functions walked, and the method calls on
    receivers of no known class (builtins, third-party objects, unannotated names: not counted)."""
    resolver = Resolver(modules)
    module_name, _, function_name = entry.partition(":")
    todo: list[tuple[Module, ClassInfo | None, ast.FunctionDef | ast.AsyncFunctionDef]] = [
        (modules[module_name], None, modules[module_name].functions[function_name])
    ]
    seen: set[int] = set()
    sites: set[Site] = set()
    walked: list[str] = []
    unresolved = 0
    while todo:
        module, owner, function = todo.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        qualified = f"{module.name}.{owner.name + '.' if owner else ''}{function.name}"
        if qualified in skip:
            continue
        walked.append(qualified)
        local: dict[str, ClassInfo | None] = {}
        for arg in function.args.args + function.args.kwonlyargs + function.args.posonlyargs:
            local[arg.arg] = resolver.annotation_class(module, arg.annotation)
        if owner is not None and function.args.args:
            local[function.args.args[0].arg] = owner

        def receiver(
            node: ast.expr, module: Module = module, local: dict[str, ClassInfo | None] = local
        ) -> ClassInfo | None:
            if isinstance(node, ast.Name):
                return local.get(node.id)
            if isinstance(node, ast.Attribute):
                base = receiver(node.value)
                return resolver.field_class(base, node.attr) if base else None
            if isinstance(node, ast.Call):
                target = callee(node)
                if target and isinstance(target[2], ast.FunctionDef | ast.AsyncFunctionDef):
                    return resolver.annotation_class(modules[target[0]], target[2].returns)
                if target and isinstance(target[2], ClassInfo):
                    return target[2]
            return None

        def callee(
            call: ast.Call, module: Module = module, local: dict[str, ClassInfo | None] = local
        ) -> tuple[str, str, object, ClassInfo | None] | None:
            """(defining module, qualified name, the def or class, its class) of a call's target."""
            func = call.func
            if isinstance(func, ast.Name) or (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                                              and func.value.id not in local):  # fmt: skip
                dotted = resolver.dotted(module, func)
                found = resolver.lookup(dotted) if dotted else None
                if found is None and dotted and isinstance(func, ast.Attribute):  # Class.method(...)
                    owner = resolver.lookup(dotted.rpartition(".")[0])
                    if owner is not None and owner[1] in owner[0].classes:
                        named = owner[0].classes[owner[1]]
                        inherited = resolver.method(named, func.attr)
                        return named.module, f"{named.name}.{func.attr}", inherited[1] if inherited else None, named
                if found is None:
                    return None
                defined, name = found
                thing: object = defined.functions.get(name) or defined.classes.get(name)
                return defined.name, name, thing, None
            if isinstance(func, ast.Attribute):
                cls = receiver(func.value)
                if cls is None:
                    return None
                found_method = resolver.method(cls, func.attr)
                if found_method is None:  # inherited from a third-party base (pydantic's model_copy): still the class's
                    return cls.module, f"{cls.name}.{func.attr}", None, cls
                owner_cls, method = found_method
                return owner_cls.module, f"{owner_cls.name}.{func.attr}", method, owner_cls
            return None

        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                local[node.targets[0].id] = (
                    receiver(node.value) if isinstance(node.value, ast.Call | ast.Attribute) else None
                )
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                local[node.target.id] = resolver.annotation_class(module, node.annotation)
            elif isinstance(node, ast.NamedExpr):
                local[node.target.id] = (
                    receiver(node.value) if isinstance(node.value, ast.Call | ast.Attribute) else None
                )
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            target = callee(node)
            if target is None:
                dotted = resolver.dotted(module, node.func) if isinstance(node.func, ast.Name | ast.Attribute) else None
                if dotted is None and isinstance(node.func, ast.Attribute):
                    unresolved += 1  # a method of something the annotations do not type (often a builtin)
                continue
            defined, name, thing, cls = target
            if room_of(defined) != module.room:
                kind = "class" if isinstance(thing, ClassInfo) else "method" if cls is not None else "function"
                sites.add(
                    Site(f"{module.name}:{function.name}", node.lineno, f"{defined}.{name}", room_of(defined), kind)
                )
            if _followed(defined, followed) and isinstance(thing, ast.FunctionDef | ast.AsyncFunctionDef):
                todo.append((modules[defined], cls, thing))
            elif _followed(defined, followed) and isinstance(thing, ClassInfo) and "__init__" in thing.methods:
                todo.append((modules[defined], thing, thing.methods["__init__"]))
    return sorted(sites, key=lambda s: (s.caller, s.line)), walked, unresolved


def _followed(module: str, followed: set[str]) -> bool:
    path = module.removeprefix(f"{PACKAGE}.").replace(".", "/")
    return any(path == f.removesuffix(".py") or path.startswith(f"{f.rstrip('/')}/") for f in followed)


def worker_lines(service: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in (service / PACKAGE / "worker").rglob("*.py"))


def rooms_per_commit(tree: Path, since: str, until: str) -> list[tuple[str, set[str]]]:
    command = ["git", "-C", str(tree), "log", "--no-merges", "--name-only", "--format=@%h", f"{since}..{until}"]
    log = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    commits: list[tuple[str, set[str]]] = []
    for line in log.splitlines():
        if line.startswith("@"):
            commits.append((line[1:], set()))
        elif line.startswith(f"service/{PACKAGE}/") and commits:
            parts = line.split("/")
            commits[-1][1].add(parts[2] if len(parts) > 3 else "(top)")
    return commits


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tree", type=Path, help="a checkout (its service/execbox is read)")
    parser.add_argument("--entry", default=f"{PACKAGE}.worker.tasks:run_next", help="the job function, module:name")
    parser.add_argument("--follow", action="append", help="folders or files under execbox/ whose calls are walked "
                        "(default: worker, and executions/lifecycle.py and outcome.py if they exist)")  # fmt: skip
    parser.add_argument(
        "--skip", action="append", help=f"functions not walked, qualified (default: {', '.join(SETUP)})"
    )
    parser.add_argument("--since", help="count rooms touched by each commit since this one")
    parser.add_argument("--until", default="HEAD", help="... up to this one (default HEAD)")
    parser.add_argument("--sites", action="store_true", help="list each counted call site")
    args = parser.parse_args()
    service = args.tree / "service"
    modules = load(service)
    followed = set(args.follow or ["worker"] + [f for f in ("executions/lifecycle.py", "executions/outcome.py")
                                                if (service / PACKAGE / f).exists()])  # fmt: skip
    print(f"tree: {args.tree}")
    print(f"lines in worker/: {worker_lines(service)}")
    sites, walked, unresolved = walk(modules, args.entry, followed, tuple(args.skip or SETUP))
    by_room = Counter(s.room for s in sites)
    kinds = Counter(s.kind for s in sites)
    print(f"cross-room calls for one execution (from {args.entry}, following {', '.join(sorted(followed))}): "
          f"{len(sites)} call sites ({kinds['function']} functions, {kinds['method']} methods, {kinds['class']} "
          f"constructors); {len(sites) - by_room['core']} outside core/; {len(walked)} functions walked; "
          f"{unresolved} method calls on untyped receivers not counted")  # fmt: skip
    for room, n in by_room.most_common():
        calls = sum(1 for s in sites if s.room == room and s.kind != "class")
        print(f"  into {room}/: {n} ({calls} without constructors)")
    by_pair = Counter((room_of(s.caller.split(":")[0]), s.room) for s in sites)
    print("  by rooms: " + ", ".join(f"{a}->{b} {n}" for (a, b), n in by_pair.most_common()))
    if args.sites:
        for s in sites:
            print(f"    {s.caller}:{s.line} -> {s.target} ({s.kind})")
    if args.since:
        commits = rooms_per_commit(args.tree, args.since, args.until)
        sizes = Counter(len(r) for _, r in commits)
        per_room = Counter(room for _, rooms in commits for room in rooms)
        service = [rooms for _, rooms in commits if rooms]
        print(f"commits {args.since}..{args.until}: {len(commits)}, {len(service)} of them in service/execbox; "
              f"rooms touched, mean {sum(map(len, service)) / max(len(service), 1):.1f} per service commit; "
              "commits by rooms touched: " + ", ".join(f"{k}: {v}" for k, v in sorted(sizes.items())))  # fmt: skip
        print("  commits touching each room: " + ", ".join(f"{r} {n}" for r, n in per_room.most_common()))


if __name__ == "__main__":
    main()
