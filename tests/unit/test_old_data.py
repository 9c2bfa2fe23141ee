"""The current code serves what an older execbox left behind (issue 29: "the Redis data of a running
stack from before the change must still serve").

tests/data/old-redis-7b2f33a.json.gz was written by commit 7b2f33a's own API and worker (with the
in-memory sandbox) through tests/data/make_old_data.py, and holds every key it left, the artifact
blobs, and what its API answered for each thing. Here that export is loaded into the session's
redis-server, the current app is built by `create_app()` from the environment alone, and each
thing is read back through the HTTP API and compared with the old answer: every field the old
answer had keeps its value (new fields may be added). Then new work is accepted beside the old,
and the current OpenAPI document keeps every old path, method, parameter, schema property and
enum value.

Only the stable entry points are used (create_app, EXECBOX_* settings, HTTP, `execbox` CLI), so
the tree may move underneath.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from execbox import cli
from execbox.api import create_app
from execbox.files.store import FileStore
from execbox.keyschema import Keys
from tests.conftest import Redis
from tests.unit.conftest import InProcess
from tests.unit.test_file_blobs import FakeBlobs

pytestmark = pytest.mark.redis
DATA = Path(__file__).resolve().parents[1] / "data"
COMMIT = "7b2f33a"
OLD = json.loads(gzip.decompress((DATA / f"old-redis-{COMMIT}.json.gz").read_bytes()))
META: dict[str, Any] = OLD["meta"]


def _dec(value: Any) -> bytes:
    return base64.b64decode(value["b64"]) if isinstance(value, dict) else str(value).encode()


def load(client: redis.Redis, keys: dict[str, Any]) -> None:
    """Write the export back key by key, each with the TTL it had left."""
    pipe = client.pipeline(transaction=False)
    for name, entry in keys.items():
        key, kind, value = _dec(name), entry["type"], entry["value"]
        if kind == "string":
            pipe.set(key, _dec(value))
        elif kind == "hash":
            pipe.hset(key, mapping={_dec(f): _dec(v) for f, v in value})
        elif kind == "list":
            pipe.rpush(key, *(_dec(v) for v in value))
        elif kind == "set":
            pipe.sadd(key, *(_dec(v) for v in value))
        elif kind == "zset":
            pipe.zadd(key, {_dec(m): s for m, s in value})
        elif kind == "stream":
            for entry_id, fields in value:
                pipe.xadd(key, {_dec(f): _dec(v) for f, v in fields}, id=entry_id)
            for group, last in entry["groups"]:
                pipe.xgroup_create(key, group, id=last, mkstream=True)
        else:
            raise AssertionError(f"{name}: type {kind} has no loader")
        if entry["pttl"] > 0:
            pipe.pexpire(key, entry["pttl"])
    pipe.execute()


@pytest.fixture(scope="module")
def old_stack(redis_server: Redis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    """The export in Redis, its artifact blobs on disk, and the current app over both."""
    client = redis.Redis.from_url(redis_server.url)
    assert not list(client.scan_iter(match=f"{META['prefix']}:*", count=1000)), "the old prefix is taken"
    load(client, OLD["redis"])
    artifacts = tmp_path_factory.mktemp("old-artifacts")
    for relative, blob in OLD["artifacts"].items():
        (artifacts / relative).parent.mkdir(parents=True, exist_ok=True)
        (artifacts / relative).write_bytes(base64.b64decode(blob))
    patch = pytest.MonkeyPatch()
    for name, value in {
        "EXECBOX_REDIS__URL": redis_server.url, "EXECBOX_REDIS__KEY_PREFIX": META["prefix"],
        "EXECBOX_QUEUE__NAME": META["queue"], "EXECBOX_ARTIFACTS_DIR": str(artifacts),
        "EXECBOX_AUTH__ADMIN_TOKEN": META["admin_token"], "EXECBOX_RETENTION_S": str(META["retention_s"]),
    }.items():  # fmt: skip
        patch.setenv(name, value)
    http = InProcess(create_app())
    try:
        yield http
    finally:
        http.close()
        patch.undo()
        for name in OLD["redis"]:
            client.delete(_dec(name))
        for key in client.scan_iter(match=f"{META['prefix']}:*", count=1000):
            client.delete(key)
        client.close()


def as_(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {META['keys'][tenant]}"}


def kept(old: Any, new: Any, where: str = "") -> list[str]:
    """Where `new` lost or changed something `old` had: each old field keeps its value (dicts may
    gain fields; lists keep their length and order)."""
    if isinstance(old, dict) and isinstance(new, dict):
        lost = [f"{where}.{k}: gone" for k in old if k not in new]
        return lost + [p for k, v in old.items() if k in new for p in kept(v, new[k], f"{where}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (o, n) in enumerate(zip(old, new, strict=True)) for p in kept(o, n, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} became {new!r}"]


@pytest.mark.parametrize("url", sorted(META["answers"]))
def test_each_old_thing_reads_back_as_the_old_code_answered(old_stack: InProcess, url: str) -> None:
    tenant = "beta" if url.endswith(META["executions"]["queued"]) else "alpha"
    answer = old_stack.get(url, headers=as_(tenant))
    assert answer.status_code == (META["answers"][url].get("status", 200) if "/handoff" in url else 200), answer.text
    assert kept(META["answers"][url], answer.json()) == []


def test_the_old_keys_still_authenticate_and_the_operator_lists_them(old_stack: InProcess) -> None:
    listed = old_stack.get("/v1/admin/keys", headers={"Authorization": f"Bearer {META['admin_token']}"})
    assert listed.status_code == 200, listed.text
    assert kept(META["operator_answers"]["/v1/admin/keys"], listed.json()) == []
    assert old_stack.get("/v1/runs", headers={"Authorization": "Bearer not-a-key"}).status_code == 401


def test_old_artifact_blobs_and_input_files_are_served_byte_for_byte(old_stack: InProcess) -> None:
    done = old_stack.get(f"/v1/executions/{META['executions']['succeeded']}", headers=as_("alpha")).json()
    blobs = {a["name"]: old_stack.get(a["url"], headers=as_("alpha")).content for a in done["artifacts"]}
    assert blobs == {"report.txt": b"three rows\n", "blob.bin": bytes(range(256))}
    printed = old_stack.get(f"/v1/executions/{META['executions']['printed']}", headers=as_("alpha")).json()
    assert printed["stdout"] == "hello from 7\n" and printed["status"] == "succeeded"


def test_an_old_input_file_reads_byte_for_byte_where_new_files_go_to_an_object_store(old_stack: InProcess) -> None:
    """The old hash holds meta and data and no `blob`: a store whose new files go elsewhere (S3 in a
    deployment set to it, a fake here) still reads it from the hash, checked against its sha256."""
    client = redis.Redis.from_url(os.environ["EXECBOX_REDIS__URL"])
    try:
        keys = Keys(META["prefix"])
        assert client.hget(keys.file(META["file"]), "blob") is None
        files = FileStore(client, keys, FakeBlobs())
        assert files.data(META["file"]) == b"a,b\n1,2\n"
        meta = files.meta(META["file"])
        assert meta is not None and meta.name == "data.csv"
    finally:
        client.close()


def test_the_old_runs_step_executions_and_the_script_invocation_read_back(old_stack: InProcess) -> None:
    run = META["answers"][f"/v1/runs/{META['run']}"]
    for step in run["steps"].values():
        done = old_stack.get(f"/v1/executions/{step['attempts'][-1]}", headers=as_("alpha")).json()
        assert done["status"] == "succeeded" and done["outputs"] == step["outputs"], done
    invoked = old_stack.get(f"/v1/executions/{META['script']['invocation']}", headers=as_("alpha")).json()
    assert invoked["status"] == "succeeded" and invoked["stdout"] == "tick\n", invoked


def test_an_old_idempotency_claim_still_answers_with_the_old_execution(old_stack: InProcess) -> None:
    again = old_stack.post("/v1/executions", json=META["idempotency"]["body"],
                           headers={**as_("alpha"), "Idempotency-Key": META["idempotency"]["key"]})  # fmt: skip
    assert again.status_code in (200, 201, 202), again.text
    assert again.json()["id"] == META["executions"]["idempotent"]
    changed = old_stack.post("/v1/executions", json={**META["idempotency"]["body"], "code": "print('twice')"},
                             headers={**as_("alpha"), "Idempotency-Key": META["idempotency"]["key"]})  # fmt: skip
    assert changed.status_code == 422 and "idempotency" in changed.json()["code"], changed.text


def test_the_old_dead_letter_is_listed_by_the_operators_command(
    old_stack: InProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["dead-letters", "list", "--loop", META["dead_letter"]["loop"]]) == 0
    listed = capsys.readouterr().out
    assert META["dead_letter"]["item"] in listed and "a schedule that cannot be read" in listed, listed


def test_new_work_is_accepted_beside_the_old(old_stack: InProcess) -> None:
    created = old_stack.post("/v1/executions", json={"language": "python", "code": "print(2)"}, headers=as_("alpha"))
    assert created.status_code in (201, 202), created.text
    assert old_stack.get(f"/v1/executions/{created.json()['id']}", headers=as_("alpha")).json()["status"] == "queued"
    plan = {"format": "plan/v1", "steps": [{"id": "one", "run": {"code": "print(1)", "language": "python"}}]}
    run = old_stack.post("/v1/runs", json={"plan": plan}, headers=as_("alpha"))
    assert run.status_code == 201, run.text
    runs = {r["id"] for r in old_stack.get("/v1/runs", headers=as_("alpha")).json()}
    assert runs == {META["run"], run.json()["id"]}
    old_run = old_stack.get(f"/v1/runs/{META['run']}", headers=as_("alpha")).json()
    assert old_run["status"] == "succeeded" and old_run["steps"]["report"]["outputs"] == {"sent": True}


# -- the OpenAPI document --------------------------------------------------------------------------


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        found: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            found = found[part]
        schema = found
    return schema


def fields(doc: dict[str, Any], schema: dict[str, Any], at: str = "", seen: frozenset[str] = frozenset()) -> set[str]:
    """Every property path a schema describes ("artifacts[].name") and each enum value it allows
    ("error.category=limit.disk"), through $refs, unions and items."""
    ref = schema.get("$ref", "")
    if ref in seen:
        return set()
    schema, seen = _resolve(doc, schema), seen | {ref}
    found = {f"{at}={value}" for value in schema.get("enum", [])}  # stored values are never renamed
    for name, sub in schema.get("properties", {}).items():
        found |= {f"{at}{name}"} | fields(doc, sub, f"{at}{name}.", seen)
    for union in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(union, []):
            found |= fields(doc, sub, at, seen)
    if "items" in schema:
        found |= fields(doc, schema["items"], f"{at}[].", seen)
    if isinstance(schema.get("additionalProperties"), dict):
        found |= fields(doc, schema["additionalProperties"], f"{at}*.", seen)
    return found


def surface(doc: dict[str, Any]) -> set[str]:
    """Each operation, its parameters, and its request and response schemas' property paths, as lines."""
    lines = set()
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            where = f"{method.upper()} {path}"
            lines.add(where)
            lines |= {f"{where} param {p['in']}:{p['name']}" for p in op.get("parameters", [])}
            for media, body in op.get("requestBody", {}).get("content", {}).items():
                lines |= {f"{where} request {media} {f}" for f in fields(doc, body.get("schema", {}))}
            for status, response in op.get("responses", {}).items():
                lines.add(f"{where} {status}")
                for media, body in response.get("content", {}).items():
                    lines |= {f"{where} {status} {media} {f}" for f in fields(doc, body.get("schema", {}))}
    return lines


def test_the_openapi_document_keeps_every_old_path_method_schema_property_and_enum_value() -> None:
    old = json.loads((DATA / f"openapi-{COMMIT}.json").read_text())
    new = create_app().openapi()
    old_surface = surface(old)
    assert len(old_surface) > 1000, "the comparison reads the old document's schemas"
    assert sorted(old_surface - surface(new)) == []
