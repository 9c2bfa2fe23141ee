"""`ebx`: execbox from a terminal (and for agents, with --json). The operator's commands stay in
the server's own `execbox` CLI.

Configuration, first found wins: --url/--key, EXECBOX_URL/EXECBOX_API_KEY, then the file
$EXECBOX_CONFIG (default ~/.config/execbox/config.toml) with `url = ...` and `api_key = ...`.

`ebx run` exits with the program's own exit code when it ran to its end, otherwise with the code
of its outcome's category (EXIT_CODES below), so a shell script can tell a timeout from a crash.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import httpx

from execbox_client.client import TERMINAL, AsyncClient, Client
from execbox_client.errors import ExecboxError
from execbox_client.types import ExecutionPublic

EXIT_CODES = {
    "limit.timeout": 124,  # as timeout(1)
    "limit.memory": 137,  # as a process killed by the OOM killer
    "limit.cpu": 125, "limit.output": 125, "limit.pids": 125, "limit.disk": 125, "limit.artifacts": 125,
    "policy.network_denied": 125,
    "cancelled": 130, "expired": 75, "sandbox.error": 70, "output.invalid": 65, "check.failed": 65,
}  # fmt: skip
"""An outcome without an exit code of the program's own: its category's code; any other: 1."""
REFUSED = 64
"""The service refused the request (4xx): the message says which field and what to do."""
UNREACHABLE = 69
"""The service could not be reached, or answered 5xx after the retries."""
NO_INPUT = 66
"""A local file could not be read."""
PLAN_EXIT_CODES = {"succeeded": 0, "failed": 1, "awaiting_approval": 3, "needs_replan": 4, "goal_failed": 5,
                   "cancelled": 130}  # fmt: skip
"""`ebx plan run`: how the run stopped."""
LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".sh": "bash", ".r": "r", ".R": "r"}


def _config(url: str | None, key: str | None) -> tuple[str | None, str | None]:
    path = Path(os.environ.get("EXECBOX_CONFIG", Path.home() / ".config" / "execbox" / "config.toml"))
    stored: dict[str, Any] = tomllib.loads(path.read_text()) if path.is_file() else {}
    return (url or os.environ.get("EXECBOX_URL") or stored.get("url"),
            key or os.environ.get("EXECBOX_API_KEY") or stored.get("api_key"))  # fmt: skip


class Context:
    def __init__(self, url: str | None, key: str | None, as_json: bool) -> None:
        self.url, self.key = _config(url, key)
        self.json = as_json

    def client(self) -> Client:
        return Client(self.url, self.key)

    def show(self, value: Any, text: str | None = None) -> None:
        click.echo(json.dumps(value, indent=2) if self.json or text is None else text)

    def show_status(self, resource: Mapping[str, Any]) -> None:
        """An execution or session: all of it with --json, else its id and status."""
        self.show(resource, f"{resource['id']} {resource['status']}")


pass_context = click.make_pass_decorator(Context)


class _Group(click.Group):
    """Every command: a refusal or an unreachable service is one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ExecboxError as exc:
            click.echo(f"ebx: {exc}", err=True)
            ctx.exit(REFUSED if exc.status < 500 else UNREACHABLE)
        except httpx.TransportError as exc:
            click.echo(f"ebx: cannot reach the service: {exc}", err=True)
            ctx.exit(UNREACHABLE)
        except OSError as exc:  # a local file
            click.echo(f"ebx: {exc}", err=True)
            ctx.exit(NO_INPUT)


@click.group(cls=_Group)
@click.option("--url", help="The service (default: EXECBOX_URL, the config file, http://127.0.0.1:8000).")
@click.option("--key", help="API key (default: EXECBOX_API_KEY, the config file).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for programs and agents.")
@click.pass_context
def main(ctx: click.Context, url: str | None, key: str | None, as_json: bool) -> None:
    """Run code in execbox's sandboxes."""
    ctx.obj = Context(url, key, as_json)


def _policy(pairs: tuple[str, ...], allow: tuple[str, ...]) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: give NAME=VALUE, e.g. timeout_s=30", param_hint="--policy")
        try:
            policy[name] = json.loads(value)
        except ValueError:
            policy[name] = value  # a policy name, a runtime
    if allow:
        policy["network"] = {"mode": "allowlist", "allow": list(allow)}
    return policy


def _upload(box: Client, specs: tuple[str, ...]) -> list[dict[str, str]]:
    files = []
    for spec in specs:
        local, _, remote = spec.partition(":")
        data = Path(local).read_bytes()
        uploaded = box.upload_file(Path(local).name, data)
        files.append({"path": remote or Path(local).name, "file_id": uploaded["id"]})
    return files


def _exit_code(execution: ExecutionPublic) -> int:
    if execution["status"] == "succeeded":
        return 0
    error = execution.get("error")
    category: str = error["category"] if error and "category" in error else execution["status"]
    if category.startswith("code.") and (exit_code := execution.get("exit_code")):
        return int(exit_code)
    return EXIT_CODES.get(category, EXIT_CODES.get(execution["status"], 1))


def _download(box: Client, execution: ExecutionPublic, out: Path) -> list[Path]:
    saved = []
    for artifact in execution.get("artifacts") or []:
        target = (out / artifact["name"]).resolve()
        if out.resolve() not in target.parents:
            raise click.ClickException(f"artifact {artifact['name']!r} would land outside {out}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(box.download(artifact["url"]))
        saved.append(target)
    return saved


def _stream(box: Client, execution_id: str, quiet: bool) -> ExecutionPublic:
    """Live output to this terminal's stdout/stderr; the finished execution."""
    finished: ExecutionPublic | None = None
    for event in box.events(execution_id):
        if event.event in ("stdout", "stderr") and not quiet:
            stream = sys.stdout if event.event == "stdout" else sys.stderr
            stream.write(event.data.get("text", ""))
            stream.flush()
        elif event.event == "end":
            finished = event.data
    return finished or box.get_execution(execution_id)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--lang", help="Language (default: from the file's extension).")
@click.option("--policy", "pairs", multiple=True, metavar="NAME=VALUE", help="A policy field, e.g. timeout_s=30.")
@click.option("--file", "files", multiple=True, metavar="LOCAL[:PATH]", help="An input file (uploaded).")
@click.option("--allow", multiple=True, metavar="HOST", help="A host the code may reach (the policy must allow it).")
@click.option("--session", help="Run in this session (ebx session new).")
@click.option("--out", type=click.Path(file_okay=False), help="Where artifacts go (default: ./execbox-out/<id>).")
@pass_context
def run(ctx: Context, file: str, lang: str | None, pairs: tuple[str, ...], files: tuple[str, ...],
        allow: tuple[str, ...], session: str | None, out: str | None) -> None:  # fmt: skip
    """Run FILE (- for stdin), streaming its output; exit with its exit code."""
    code = sys.stdin.read() if file == "-" else Path(file).read_text()
    language = lang or LANGUAGES.get(Path(file).suffix)
    if language is None:
        raise click.BadParameter("cannot tell the language from the file name; give --lang", param_hint="--lang")
    with ctx.client() as box:
        fields: dict[str, Any] = {"policy": _policy(pairs, allow), "files": _upload(box, files)}
        if session:
            fields["session"] = session
        execution = box.submit(code, language, **fields)
        finished = _stream(box, execution["id"], quiet=ctx.json)
        saved = _download(box, finished, Path(out or Path("execbox-out") / finished["id"]))
    if ctx.json:
        ctx.show({**finished, "downloaded": [str(p) for p in saved]})
    else:
        error = finished.get("error")
        outcome = finished["status"] + (f" ({error['category']}: {error.get('message', '')})" if error else "")
        click.echo(f"ebx: {finished['id']} {outcome}" + (f"; artifacts in {saved[0].parent}" if saved else ""),
                   err=True)  # fmt: skip
    sys.exit(_exit_code(finished))


@main.command()
@click.argument("execution_id")
@click.option("--wait", "wait_s", type=float, help="Wait up to this long for the end.")
@pass_context
def get(ctx: Context, execution_id: str, wait_s: float | None) -> None:
    """An execution as the service has it."""
    with ctx.client() as box:
        execution = box.get_execution(execution_id, wait_s=wait_s)
    ctx.show_status(execution)


@main.command()
@click.argument("execution_id")
@pass_context
def cancel(ctx: Context, execution_id: str) -> None:
    """Cancel a queued or running execution."""
    with ctx.client() as box:
        execution = box.cancel_execution(execution_id)
    ctx.show_status(execution)


@main.command()
@click.argument("execution_id")
@pass_context
def logs(ctx: Context, execution_id: str) -> None:
    """Its output, live while it runs (the whole of it afterwards)."""
    with ctx.client() as box:
        if ctx.json:
            for event in box.events(execution_id):
                click.echo(json.dumps({"id": event.id, "event": event.event, "data": event.data}))
        else:
            finished = _stream(box, execution_id, quiet=False)
            if finished["status"] not in TERMINAL:
                click.echo(f"ebx: {execution_id} {finished['status']}", err=True)


@main.command()
@click.argument("execution_id")
@click.option("--out", type=click.Path(file_okay=False), help="Where they go (default: ./execbox-out/<id>).")
@pass_context
def artifacts(ctx: Context, execution_id: str, out: str | None) -> None:
    """Download an execution's artifacts."""
    with ctx.client() as box:
        saved = _download(box, box.get_execution(execution_id), Path(out or Path("execbox-out") / execution_id))
    ctx.show([str(p) for p in saved], "\n".join(str(p) for p in saved) or "no artifacts")


@main.group()
def session() -> None:
    """Sessions: a sandbox that keeps its state across runs."""


@session.command("new")
@click.option("--lang", default="python", show_default=True)
@click.option("--idle-timeout", "idle_timeout_s", type=int, help="Seconds of no use after which it ends.")
@pass_context
def session_new(ctx: Context, lang: str, idle_timeout_s: int | None) -> None:
    fields = {"idle_timeout_s": idle_timeout_s} if idle_timeout_s else {}
    with ctx.client() as box:
        created = box.create_session(lang, **fields)
    ctx.show(created, created["id"])


@session.command("exec")
@click.argument("session_id")
@click.argument("code")
@pass_context
def session_exec(ctx: Context, session_id: str, code: str) -> None:
    """Run CODE in the session; the value of its last expression is printed too."""
    with ctx.client() as box:
        language = box.get_session(session_id)["language"]
        execution = box.submit(code, language, session=session_id)
        finished = _stream(box, execution["id"], quiet=ctx.json)
    if ctx.json:
        ctx.show(finished)
    else:
        for result in finished.get("results") or []:
            plain = (result.get("data") or {}).get("text/plain")
            text = plain.get("text") if plain else None
            if text is not None:
                click.echo(text)
    sys.exit(_exit_code(finished))


@session.command("rm")
@click.argument("session_id")
@pass_context
def session_rm(ctx: Context, session_id: str) -> None:
    with ctx.client() as box:
        ended = box.delete_session(session_id)
    ctx.show_status(ended)


@main.group()
def plan() -> None:
    """Plans: several steps, re-planned instead of retried blindly."""


def _plan_file(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded


@plan.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@pass_context
def plan_validate(ctx: Context, file: str) -> None:
    """Check a plan (JSON) without running it: an invalid one exits 64 naming each field at fault."""
    with ctx.client() as box:
        answer = box.validate_plan(_plan_file(file))
    ctx.show(answer, "valid")


@plan.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@pass_context
def plan_run(ctx: Context, file: str) -> None:
    """Run a plan, showing each step as it changes; a run that needs a re-plan prints its hand-off."""
    with ctx.client() as box:
        run_ = box.start_run({"plan": _plan_file(file)})
        seen: dict[str, str] = {}
        while True:  # each answer comes as soon as a step changed
            for step_id, step in sorted(run_["steps"].items()):
                if seen.get(step_id) != step["status"] and not ctx.json:
                    click.echo(f"  {step_id}: {step['status']}", err=True)
                seen[step_id] = step["status"]
            if run_["status"] != "running":
                break
            run_ = box.get_run(run_["id"], wait_s=30, after=len(run_["events"]))
        handoff = box.run_handoff(run_["id"]) if run_["status"] == "needs_replan" else None
    ctx.show({**run_, "handoff": handoff} if handoff else run_,
             f"{run_['id']} {run_['status']}" + (f"\n{json.dumps(handoff, indent=2)}" if handoff else ""))  # fmt: skip
    sys.exit(PLAN_EXIT_CODES.get(run_["status"], 1))


@main.command()
@click.argument("query", required=False)
@pass_context
def scripts(ctx: Context, query: str | None) -> None:
    """Find scripts in the library."""
    with ctx.client() as box:
        found = box.list_scripts(q=query)
    ctx.show(found, "\n".join(f"{s['name']}  {s.get('description', '')}" for s in found))


@main.command()
@pass_context
def schedules(ctx: Context) -> None:
    """The tenant's schedules."""
    with ctx.client() as box:
        found = box.list_schedules()
    ctx.show(found, "\n".join(f"{s['id']}  {s['script']}  {s['cron']}" + ("  paused" if s["paused"] else "")
                              for s in found))  # fmt: skip


@main.command()
@click.option("--type", "kind", help="Only this type, e.g. script.failed.")
@pass_context
def events(ctx: Context, kind: str | None) -> None:
    """The surprises scripts raised."""
    with ctx.client() as box:
        found = box.list_events(type=kind)
    ctx.show(found, "\n".join(json.dumps(e) for e in found))


@main.command("mcp")
@click.option(
    "--stdio", is_flag=True, required=True, help="Serve on stdin and stdout (the transport desktop agents use)."
)
@pass_context
def mcp_command(ctx: Context, stdio: bool) -> None:
    """Serve execbox's MCP tools on stdio, each call forwarded to the configured execbox."""
    try:
        from mcp.server.fastmcp import FastMCP

        from execbox_client.mcp import build
    except ImportError as exc:
        raise click.ClickException(f"needs the mcp extra: pip install 'execbox-client[mcp]' ({exc})") from exc
    build(FastMCP("execbox"), lambda _: AsyncClient(ctx.url, ctx.key)).run("stdio")
