"""FakeRuntime: an in-memory sandbox that runs nothing, for unit tests of the worker's paths.

It implements the same `Runtime` protocol as DockerRuntime and gives back the same SandboxOutcome, so
everything after the sandbox (classification, result reading, artifacts, the stored record, events,
webhooks, plans) runs as it does in production. What a "program" does is decided here:

1. a `Script` registered for the run's execution id, else one registered for its exact code;
2. otherwise the code is read as a tiny language, one statement at a time: `name = <literal>`,
   `print(<literal or name>, ...)` and `raise SystemExit(<int>)`; any other statement fails the
   run like an uncaught Python exception (exit 1, a traceback line on stderr) that names the fake.

A one-shot run starts from an empty namespace and workspace; a session keeps both across its
calls, so `x = 2` in one call and `print(x)` in the next prints `2`. A Script's files are written
under /workspace (paths relative to it), its outputs and check go to the result file the run's
environment names, and the collect path is handed to `spec.collector` as the same tar stream the
engine's archive API gives. The warm pool is Docker's alone: the fake has no `create_pooled`.
"""

from __future__ import annotations

import ast
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from execbox.sandbox.errors import RuntimeUnavailable
from execbox.sandbox.runtime import WORKDIR, ContainerInfo, SandboxControl, SandboxOutcome, SandboxSpec

FAKE_IMAGE_ID = "sha256:fake"
_RESULT_ENV = "EXECBOX_RESULT_FILE"
_DEFAULT_RESULT = "out/.execbox/result.json"


@dataclass(frozen=True)
class Script:
    """What a faked program does."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Written under /workspace (e.g. "out/report.txt" becomes an artifact)."""
    outputs: Mapping[str, Any] | None = None
    """Written to the result file as {"outputs": ...}: the execution's declared outputs."""
    check: Mapping[str, Any] | None = None
    """Written to the result file as {"check": ...}: a failed check."""
    timed_out: bool = False
    oom_killed: bool = False
    fault: str | None = None
    """Raise RuntimeUnavailable with this message instead of running (the engine failed)."""
    hold: threading.Event | None = None
    """Block until this is set or the run is cancelled (to test cancels and leases)."""


class _Workspace:
    """A sandbox's /workspace and interpreter namespace (one per run, one per session)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.names: dict[str, Any] = {}

    def unpack(self, archive: bytes | None) -> set[str]:
        written: set[str] = set()
        if not archive:
            return written
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar:
                data = tar.extractfile(member) if member.isreg() else None
                if data is not None:
                    self.files[member.name] = data.read()
                    written.add(member.name)
        return written

    def tar(self, collect_path: str, only: set[str] | None = None) -> bytes:
        """The collect path as the engine's archive API names it ("out/..." or "workspace/...")."""
        prefix = f"{collect_path}/" if collect_path else ""
        root = collect_path or WORKDIR.strip("/")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path, data in sorted(self.files.items()):
                if not path.startswith(prefix) or (only is not None and path not in only):
                    continue
                info = tarfile.TarInfo(f"{root}/{path[len(prefix) :]}")
                info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


def interpret(code: str, names: dict[str, Any]) -> Script:
    """The default reading of a program's code (see the module docstring); `names` is updated."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return Script(stderr=f'  File "main.py", line {exc.lineno}\nSyntaxError: {exc.msg}\n', exit_code=1)
    out: list[str] = []
    for statement in tree.body:
        try:
            match statement:
                case ast.Assign(targets=[ast.Name(id=name)], value=value):
                    names[name] = _value(value, names)
                case ast.Expr(value=ast.Call(func=ast.Name(id="print"), args=args, keywords=[])):
                    out.append(" ".join(str(_value(arg, names)) for arg in args) + "\n")
                case ast.Raise(exc=ast.Call(func=ast.Name(id="SystemExit"), args=[ast.Constant(value=int() as code_)])):
                    return Script(stdout="".join(out), exit_code=code_)
                case _:
                    raise NotImplementedError(f"the fake sandbox does not interpret {ast.unparse(statement)!r}")
        except (NotImplementedError, NameError, ValueError) as exc:
            trace = f"Traceback (most recent call last):\n{type(exc).__name__}: {exc}\n"
            return Script(stdout="".join(out), stderr=trace, exit_code=1)
    return Script(stdout="".join(out))


def _value(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise NameError(f"name {node.id!r} is not defined")
        return names[node.id]
    return ast.literal_eval(node)


class FakeKernel:
    """A session's sandbox: one workspace and namespace kept across calls."""

    def __init__(self, runtime: FakeRuntime, spec: SandboxSpec, session_id: str) -> None:
        self.runtime, self.spec, self.session_id = runtime, spec, session_id
        self.workspace = _Workspace()
        self.workspace.unpack(spec.input_archive)
        self.gone: str | None = None
        self.closed = False
        self.calls: list[str] = []
        self.ops: list[dict[str, Any]] = []
        self.listener: Callable[[dict[str, Any]], None] | None = None

    def run_cell(self, spec: SandboxSpec, code: str, control: SandboxControl) -> SandboxOutcome:
        self.calls.append(code)
        return self.runtime.execute(spec, code, control, self.workspace, session=True)

    def close(self) -> None:
        self.closed = True
        self.gone = self.gone or "closed"

    def op(self, request: dict[str, Any]) -> None:
        """Answers every file or process request with a refusal (the fake keeps no filesystem)."""
        self.ops.append(request)
        if self.listener is not None:
            error = {"kind": "invalid", "message": "the fake sandbox serves no files or processes"}
            self.listener({"ev": "reply", "id": request.get("id"), "error": error})

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        self.listener = listener


class FakeRuntime:
    """The Runtime protocol in memory; `runs` and `sessions` record what was asked of it."""

    def __init__(self, scripts: Mapping[str, Script] | None = None) -> None:
        self.scripts: dict[str, Script] = dict(scripts or {})
        """By execution id or by exact code."""
        self.runs: list[SandboxSpec] = []
        self.sessions: dict[str, FakeKernel] = {}
        self.closed = False
        self._lock = threading.Lock()

    # the execution seam
    def run(self, spec: SandboxSpec, control: SandboxControl) -> SandboxOutcome:
        code = spec.files[0][1].decode() if spec.files else ""  # the worker puts the program first
        return self.execute(spec, code, control, _Workspace(), session=False)

    def open_session(self, spec: SandboxSpec, session_id: str, start_timeout_s: float) -> FakeKernel:
        session = FakeKernel(self, spec, session_id)
        with self._lock:
            self.sessions[session_id] = session
        return session

    def execute(
        self, spec: SandboxSpec, code: str, control: SandboxControl, workspace: _Workspace, session: bool
    ) -> SandboxOutcome:
        """One run or call: what the program does, then the outcome and the collection a sandbox gives."""
        with self._lock:
            self.runs.append(spec)
            script = self.scripts.get(spec.execution_id) or self.scripts.get(code)
        if script is not None and script.fault is not None:
            raise RuntimeUnavailable(script.fault)
        t0 = time.monotonic()
        stopped = threading.Event()
        control.set_killer(stopped.set)
        written = {path for path, _ in spec.files} | workspace.unpack(spec.input_archive)
        workspace.files.update(spec.files)
        if script is None:
            script = interpret(code, workspace.names)
        if script.hold is not None:
            while not (script.hold.is_set() or stopped.is_set()):
                stopped.wait(0.01)
        cancelled = control.cancelled
        if not cancelled:
            written |= self._write(spec, script, workspace)
        stdout, stderr = script.stdout.encode(), script.stderr.encode()
        cap = spec.limits.output_bytes
        if spec.on_output is not None:
            for fd, data in ((1, stdout), (2, stderr)):
                if data:
                    spec.on_output(fd, data)
        ended = time.monotonic()
        if spec.collector is not None:
            prefix = f"{spec.collect_path}/" if spec.collect_path else ""
            only = {p for p in written if p.startswith(prefix)} if session else None
            if only is not None:  # a session's call: only what it wrote is its own (as the kernel reports)
                spec.collector.only = frozenset(p[len(prefix) :] for p in only)
            spec.collector(iter([workspace.tar(spec.collect_path, only)]))
        return SandboxOutcome(
            exit_code=None if cancelled else script.exit_code,
            stdout=stdout[:cap],
            stderr=stderr[:cap],
            stdout_total=len(stdout),
            stderr_total=len(stderr),
            stdout_truncated=len(stdout) > cap,
            stderr_truncated=len(stderr) > cap,
            timed_out=script.timed_out,
            cancelled=cancelled,
            oom_killed=script.oom_killed,
            image_id=FAKE_IMAGE_ID,
            run_ms=(ended - t0) * 1000,
            collect_ms=(time.monotonic() - ended) * 1000,
            warm=session,
        )

    @staticmethod
    def _write(spec: SandboxSpec, script: Script, workspace: _Workspace) -> set[str]:
        files = dict(script.files)
        if script.outputs is not None or script.check is not None:
            result_path = dict(spec.env).get(_RESULT_ENV, f"{WORKDIR}/{_DEFAULT_RESULT}")
            result: dict[str, Any] = {}
            if script.outputs is not None:
                result["outputs"] = dict(script.outputs)
            if script.check is not None:
                result["check"] = dict(script.check)
            files[result_path.removeprefix(f"{WORKDIR}/")] = json.dumps(result).encode()
        workspace.files.update(files)
        return set(files)

    # the engine's health
    def ping(self) -> None:
        pass

    def image_id(self, image: str) -> str:
        return FAKE_IMAGE_ID

    def runtimes(self) -> list[str]:
        return ["runc"]

    # housekeeping: the fake leaves nothing behind to reap
    def managed_containers(self, deployment: str) -> list[ContainerInfo]:
        return []

    def remove(self, container_id: str) -> None:
        pass

    def managed_networks(self, deployment: str) -> list[ContainerInfo]:
        return []

    def remove_network(self, network_id: str, proxy_container: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True
