"""Writes the data set tests/unit/test_old_data.py serves with the current code: Redis data and the
OpenAPI document as an older execbox (the tree this runs from) left them.

Run it with the OLD code on the path, from a checkout of that commit:

    git worktree add --detach /work/wt-old 7b2f33a && ln -s "$PWD/.venv" /work/wt-old/.venv
    cd /work/wt-old && PYTHONPATH=service:clients/python .venv/bin/python \\
        /work/main/tests/data/make_old_data.py /work/main/tests/data 7b2f33a

Everything is written through that code's own paths: the API in-process (FastAPI's TestClient,
lifespan and background threads included) and the worker's job function with the in-memory
sandbox (execbox.sandbox.fake), so no Docker is needed. It starts a throwaway redis-server, then
exports every key (type, value, TTL, streams with their consumer groups; bytes that are not UTF-8
as base64) to old-redis-<commit>.json.gz, with the artifact blobs from the artifacts directory and
what a reader needs to read it back (keys, ids, prefix) under "meta".
"""

from __future__ import annotations

import base64
import gzip
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PREFIX = "old7b"
ADMIN_TOKEN = "o" * 32
RETENTION_S = 10 * 365 * 24 * 3600
"""Long, so that nothing the old code wrote has lapsed (or is swept) when the test reads it years on."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def _enc(raw: bytes) -> Any:
    """A value as JSON: text when it is UTF-8, else {"b64": ...}."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode()}


def export(client: Any) -> dict[str, Any]:
    """Every key of the database, by type, with its remaining TTL in ms (-1: none)."""
    out: dict[str, Any] = {}
    for key in sorted(client.scan_iter(count=1000)):
        kind = client.type(key).decode()
        entry: dict[str, Any] = {"type": kind, "pttl": client.pttl(key)}
        if kind == "string":
            entry["value"] = _enc(client.get(key))
        elif kind == "hash":
            entry["value"] = [[_enc(f), _enc(v)] for f, v in sorted(client.hgetall(key).items())]
        elif kind == "list":
            entry["value"] = [_enc(v) for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            entry["value"] = sorted((_enc(v) for v in client.smembers(key)), key=json.dumps)
        elif kind == "zset":
            entry["value"] = [[_enc(m), s] for m, s in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            entry["value"] = [[i.decode(), [[_enc(f), _enc(v)] for f, v in fields.items()]]
                              for i, fields in client.xrange(key)]  # fmt: skip
            info = client.xinfo_stream(key)
            entry["last_id"] = info["last-generated-id"].decode()
            # Pending entries are not kept: a restored group starts with none (as after a claim lapse).
            entry["groups"] = [[g["name"].decode(), g["last-delivered-id"].decode()] for g in client.xinfo_groups(key)]
        else:
            raise SystemExit(f"{key!r}: type {kind} is not exported")
        out[_enc(key)] = entry
    return out


def main(target: Path, commit: str) -> None:
    import redis

    tmp = Path(tempfile.mkdtemp(prefix="old-data-"))
    port = _free_port()
    server = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        _wait(lambda: _pings(client), 10, "redis-server")
        os.environ.update({
            "EXECBOX_REDIS__URL": f"redis://127.0.0.1:{port}/0", "EXECBOX_REDIS__KEY_PREFIX": PREFIX,
            "EXECBOX_QUEUE__NAME": PREFIX, "EXECBOX_ARTIFACTS_DIR": str(tmp / "artifacts"),
            "EXECBOX_AUTH__ADMIN_TOKEN": ADMIN_TOKEN, "EXECBOX_RETENTION_S": str(RETENTION_S),
            "EXECBOX_WEBHOOKS__ALLOW_HOSTS": '["127.0.0.1"]',
        })  # fmt: skip
        meta = write(client)
        data = {
            "commit": commit,
            "meta": meta,
            "redis": export(client),
            "artifacts": {
                str(p.relative_to(tmp / "artifacts")): base64.b64encode(p.read_bytes()).decode()
                for p in sorted((tmp / "artifacts").rglob("*")) if p.is_file()
            },
        }  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    with gzip.open(target / f"old-redis-{commit}.json.gz", "wt") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    openapi = _old("execbox.api:create_app")().openapi()
    (target / f"openapi-{commit}.json").write_text(json.dumps(openapi, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"{len(data['redis'])} keys, {len(data['artifacts'])} blobs, {len(openapi['paths'])} paths\n")


def _old(name: str) -> Any:
    """`module:attribute`, or a module."""
    module, _, attribute = name.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


def write(client: Any) -> dict[str, Any]:
    """The data set, through the old code's API and worker; what the reader needs to find it again."""
    from fastapi.testclient import TestClient

    # The old tree's modules by name: they are that commit's, not the current tree's (whose rooms move).
    create_app, Keys, Guard, Settings, FakeRuntime, Script, ApiKeys, context, WorkerContext, report_health, \
        SessionHost, run_next = (_old(name) for name in (
            "execbox.api:create_app", "execbox.core.keys:Keys", "execbox.core.poison:Guard",
            "execbox.core.settings:Settings", "execbox.sandbox.fake:FakeRuntime", "execbox.sandbox.fake:Script",
            "execbox.tenancy.apikeys:ApiKeys", "execbox.worker.context", "execbox.worker.context:WorkerContext",
            "execbox.worker.reaper:report_health", "execbox.worker.sessions:SessionHost",
            "execbox.worker.tasks:run_next"))  # fmt: skip

    settings = Settings()
    alpha_key, alpha_info = ApiKeys(client, PREFIX).create("alpha")
    beta_key, _ = ApiKeys(client, PREFIX).create("beta")
    alpha: dict[str, str] = {"Authorization": f"Bearer {alpha_key}"}
    beta: dict[str, str] = {"Authorization": f"Bearer {beta_key}"}
    operator = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    fake = FakeRuntime({
        "make()": Script(stdout="made 3 rows\n", outputs={"rows": 3, "label": "héllo"},
                         files={"out/report.txt": b"three rows\n", "out/blob.bin": bytes(range(256))}),
        "judge()": Script(check={"message": "rows differ", "details": {"want": 4}}),
        "crash()": Script(stderr="Traceback (most recent call last):\nKeyError: 'a'\n", exit_code=1),
        "spin()": Script(stdout="partial\n", timed_out=True),
        "fetch()": Script(outputs={"rows": [1, 2, 3]}),
        "total()": Script(outputs={"total": 6}),
        "report()": Script(stdout="total 6\n", outputs={"sent": True}),
    })  # fmt: skip
    ctx = WorkerContext.build(settings, "w-old", fake)
    context.install(ctx)
    meta: dict[str, Any] = {
        "prefix": PREFIX, "queue": PREFIX, "admin_token": ADMIN_TOKEN, "retention_s": RETENTION_S,
        "keys": {"alpha": alpha_key, "beta": beta_key}, "alpha_key_id": alpha_info.key_id,
    }  # fmt: skip

    def ok(answer: Any, *codes: int) -> Any:
        assert answer.status_code in (codes or (200, 201, 202)), (answer.status_code, answer.text)
        return answer.json()

    with TestClient(create_app(settings)) as http:
        # An input file, and executions that ended each way the old worker could end them.
        upload = ok(http.post("/v1/files", files={"file": ("data.csv", b"a,b\n1,2\n", "text/csv")}, headers=alpha))
        meta["file"] = upload["id"]
        ids = {}
        bodies: dict[str, dict[str, Any]] = {
            "succeeded": {"code": "make()", "labels": {"team": "data"}},
            "printed": {"code": "print('hello from', 7)", "files": [{"path": "data.csv", "file_id": upload["id"]}]},
            "check_failed": {"code": "judge()"},
            "crashed": {"code": "crash()"},
            "exited": {"code": "raise SystemExit(3)"},
            "timed_out": {"code": "spin()"},
        }
        for name, body in bodies.items():
            ids[name] = ok(http.post("/v1/executions", json={"language": "python", **body}, headers=alpha))["id"]
            assert run_next({}) == ids[name]
        # An idempotency claim, answered once and kept.
        claimed = http.post("/v1/executions", json={"language": "python", "code": "print('once')"},
                            headers={**alpha, "Idempotency-Key": "old-claim-1"})  # fmt: skip
        ids["idempotent"] = ok(claimed)["id"]
        run_next({})
        meta["idempotency"] = {"key": "old-claim-1", "body": {"language": "python", "code": "print('once')"}}

        # A plan run of three steps, advanced by the API's plan consumer as each step ends.
        steps = [
            {"id": "fetch", "run": {"code": "fetch()", "language": "python"}},
            {"id": "total", "run": {"code": "total()", "language": "python"},
             "args": {"rows": {"$ref": "/steps/fetch/outputs/rows"}}},
            {"id": "report", "run": {"code": "report()", "language": "python"},
             "args": {"total": {"$ref": "/steps/total/outputs/total"}}},
        ]  # fmt: skip
        run = ok(http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": steps}}, headers=alpha))
        for _ in steps:
            _wait(lambda: run_next({}) != "nothing to run", 10, "the next step")
        ended = _wait(lambda: (r := ok(http.get(f"/v1/runs/{run['id']}", headers=alpha)))["status"] != "running" and r,
                      10, "the run")  # fmt: skip
        assert ended["status"] == "succeeded", ended
        meta["run"] = run["id"]

        # A registered script with two versions; an invocation of the first, which proves it.
        for version, code in (("1.0.0", "print('tick')\n"), ("1.1.0", "print('tick', 2)\n")):
            ok(http.post("/v1/scripts", json={"name": "tick", "version": version, "code": code,
                                              "description": f"tick {version}",
                                              "input_schema": {"type": "object"}}, headers=alpha))  # fmt: skip
        invoked = ok(http.post("/v1/scripts/tick/invoke", json={"version": "1.0.0"}, headers=alpha))
        assert run_next({}) == invoked["id"]
        ok(http.post("/v1/scripts/tick/versions/1.0.0/promote", json={"status": "proven", "evidence": [invoked["id"]]},
                     headers=alpha))  # fmt: skip
        meta["script"] = {"name": "tick", "versions": ["1.0.0", "1.1.0"], "invocation": invoked["id"]}

        # A schedule of that script, paused so that no scheduler ever fires it after the export.
        schedule = ok(http.post("/v1/schedules", json={"script": "tick@1.0.0", "cron": "0 3 * * 1"}, headers=alpha))
        ok(http.post(f"/v1/schedules/{schedule['id']}/pause", headers=alpha))
        meta["schedule"] = schedule["id"]

        # A session with two cells, held by the worker's session host, then deleted by its owner.
        report_health(ctx)
        stop = threading.Event()
        host = SessionHost(ctx)
        thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
        thread.start()
        session = ok(http.post("/v1/sessions", json={"language": "python"}, headers=alpha))["id"]
        cells = []
        for code in ("x = 20", "print('x is', x)"):
            cell = ok(http.post("/v1/executions", json={"language": "python", "code": code, "session": session},
                                headers=alpha))  # fmt: skip
            done = http.get(f"/v1/executions/{cell['id']}?wait=10", headers=alpha).json()
            assert done["status"] == "succeeded", done
            cells.append(cell["id"])
        ok(http.delete(f"/v1/sessions/{session}", headers=alpha))
        stop.set()
        thread.join(5)
        host.join(5)
        meta["session"] = {"id": session, "cells": cells}

        # A dead letter: a scheduler item that failed its one allowed attempt, set aside by the guard.
        keys = Keys(PREFIX)
        client.zadd(keys.schedules_due, {"sch_poisoned": 0})
        guard = Guard(client, keys, "scheduler", (keys.schedules_due,), max_attempts=1)
        guard.record(keys.schedules_due, "sch_poisoned", lambda: _fail("a schedule that cannot be read"))
        meta["dead_letter"] = {"loop": "scheduler", "item": "sch_poisoned"}

        # A queued execution no worker took, of the other tenant (last: the worker takes the oldest).
        ids["queued"] = ok(http.post("/v1/executions", json={"language": "python", "code": "print(1)"}, headers=beta))[
            "id"
        ]
        meta["executions"] = ids

        # What the old API answered for each, so the test compares the new answers with these.
        meta["answers"] = {
            **{f"/v1/executions/{i}": http.get(f"/v1/executions/{i}", headers=alpha if n != "queued" else beta).json()
               for n, i in ids.items()},
            **{f"/v1/executions/{i}": http.get(f"/v1/executions/{i}", headers=alpha).json() for i in cells},
            f"/v1/runs/{run['id']}": http.get(f"/v1/runs/{run['id']}", headers=alpha).json(),
            "/v1/scripts/tick": http.get("/v1/scripts/tick", headers=alpha).json(),
            "/v1/scripts/tick/versions/1.0.0": http.get("/v1/scripts/tick/versions/1.0.0", headers=alpha).json(),
            f"/v1/schedules/{schedule['id']}": http.get(f"/v1/schedules/{schedule['id']}", headers=alpha).json(),
            f"/v1/sessions/{session}": http.get(f"/v1/sessions/{session}", headers=alpha).json(),
            f"/v1/files/{upload['id']}": http.get(f"/v1/files/{upload['id']}", headers=alpha).json(),
            f"/v1/executions/{ids['succeeded']}/record": http.get(f"/v1/executions/{ids['succeeded']}/record",
                                                                  headers=alpha).json(),
            f"/v1/runs/{run['id']}/handoff": http.get(f"/v1/runs/{run['id']}/handoff", headers=alpha).json(),
            f"/v1/schedules/{schedule['id']}/firings": http.get(f"/v1/schedules/{schedule['id']}/firings",
                                                                headers=alpha).json(),
            **{listing: http.get(listing, headers=alpha).json()
               for listing in ("/v1/runs", "/v1/scripts", "/v1/schedules", "/v1/sessions")},
        }  # fmt: skip
        meta["operator_answers"] = {"/v1/admin/keys": http.get("/v1/admin/keys", headers=operator).json()}
    context._current = None
    return meta


def _fail(message: str) -> None:
    raise ValueError(message)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
