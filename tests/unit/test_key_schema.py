"""Tenant namespaces: the key schema enumerated against hostile tenant names, reserved names refused,
and data of the older layout moved (and readable through the API) by the migration."""

from __future__ import annotations

import hashlib
import inspect
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from execbox.api import create_app
from execbox.core.keymigration import migrate
from execbox.keyschema import SCHEMA, Keys
from execbox.settings import Settings
from execbox.tenancy.apikeys import RESERVED_TENANTS, TENANT_PATTERN, ApiKeys
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis

P = "p"
OWN_NAMESPACE = {"secret", "queue"}
"""Tenant-keyed families kept outside `t:`, each with the tenant at a fixed place (see execbox.core.keys)."""
HOSTILE = sorted(
    {segment for spec in SCHEMA for segment in spec.pattern.replace("{", ":").replace("}", ":").split(":") if segment}
    | RESERVED_TENANTS
    | {"t", "p", "active", "due", "default", "alpha", "tenant", "open", "0", "a-b", "a_b"}
)
"""Every word of the key schema (its fixed segments and its variables' names) and the reserved names,
as tenant names: each passes TENANT_PATTERN, so only the layout keeps them apart."""
ARGS = ["x", "active", "due", "t", "a:b", "t:runs", "alpha"]
"""Values for a key's other parts (ids, names, routes): hostile too, `:` included."""


def _key_functions() -> tuple[dict[str, Any], dict[str, Any]]:
    """Keys' public methods and properties that build key names, split into those that take a tenant
    and the shared ones."""
    tenant_fns: dict[str, Any] = {}
    shared: dict[str, Any] = {}
    for name, member in inspect.getmembers(Keys):
        if name.startswith("_") or name in ("pattern", "tenant_keys"):
            continue
        if isinstance(member, property):
            shared[name] = member
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            (tenant_fns if "tenant" in params else shared)[name] = member
    return tenant_fns, shared


def _keys_of(fn: Any, keys: Keys, tenant: str | None) -> Iterator[tuple[str, ...]]:
    """Every key `fn` builds for `tenant` (None: a shared function) over the hostile values of its other parts."""
    params = list(inspect.signature(fn).parameters)[1:]
    others = [p for p in params if p != "tenant"]
    combos: list[list[Any]] = [[]]
    for param in others:
        values: list[Any] = [0, 1, 29_000_000] if param in ("minute", "uid") else ARGS
        combos = [[*c, v] for c in combos for v in values]
    for combo in combos:
        rest = iter(combo)
        call = [tenant if p == "tenant" else next(rest) for p in params]
        built = fn(keys, *call)
        yield tuple(built) if isinstance(built, tuple) else (built,)


def test_hostile_tenant_names_are_all_valid_names() -> None:
    """The enumeration below is only a proof if its names would pass the name check (the reserved list aside)."""
    assert {"active", "due", "t"} <= set(HOSTILE)
    assert [t for t in HOSTILE if not TENANT_PATTERN.match(t)] == []


def test_no_tenant_name_spells_a_shared_key_or_another_tenants_key() -> None:
    keys = Keys(P)
    tenant_fns, shared_fns = _key_functions()
    assert {"runs", "schedules", "active", "sessions_of", "open_sessions", "secret"} <= set(tenant_fns)
    shared_keys: set[str] = set()
    for name, fn in shared_fns.items():
        built = [(getattr(keys, name),)] if isinstance(fn, property) else list(_keys_of(fn, keys, None))
        for group in built:
            for key in group:
                assert not key.startswith(f"{P}:t:"), f"shared key {name} -> {key} is inside the tenant namespace"
                shared_keys.add(key)
    owner_of: dict[str, tuple[str, str]] = {}
    for name, fn in tenant_fns.items():
        for tenant in HOSTILE:
            for group in _keys_of(fn, keys, tenant):
                for key in group:
                    if name not in OWN_NAMESPACE:
                        assert key.startswith(f"{P}:t:"), f"{name}({tenant!r}) -> {key} is outside the tenant namespace"
                    assert key not in shared_keys, f"tenant {tenant!r} spells the shared key {key} through {name}"
                    seen = owner_of.setdefault(key, (tenant, name))
                    assert seen[0] == tenant, f"{key}: tenant {tenant!r} ({name}) and tenant {seen[0]!r} ({seen[1]})"
    # the two collisions found: a tenant named `active` or `due` and the shared indexes
    assert keys.runs("active") != keys.active_runs and keys.schedules("due") != keys.schedules_due
    # the schema says the same as the functions: tenant patterns under t: (but the two families of their own)
    for spec in SCHEMA:
        if "{tenant}" in spec.pattern and not spec.pattern.startswith(("secret:", "q:")):
            assert spec.pattern.startswith("t:"), spec.pattern
        if spec.pattern.startswith("t:"):
            assert spec.pattern.split(":")[-1] != "" and "{tenant}" in spec.pattern, spec.pattern


def test_reserved_tenant_names_are_refused(settings: Settings, client: redis.Redis) -> None:
    api_keys = ApiKeys(client, settings.redis.key_prefix)
    for name in ("active", "due", "live", "t"):
        with pytest.raises(ValueError, match="reserved"):
            api_keys.create(name)
    token = SecretStr("a" * 24)
    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": token})})
    http = InProcess(create_app(admin))
    try:
        operator = {"Authorization": "Bearer " + "a" * 24}
        refused = http.post("/v1/admin/keys", json={"tenant": "due"}, headers=operator)
        assert refused.status_code == 422 and "reserved" in refused.text, refused.text
        assert http.post("/v1/admin/keys", json={"tenant": "duet"}, headers=operator).status_code == 201
    finally:
        http.close()
    assert [k.tenant for k in api_keys.list()] == ["duet"], "nothing stored for the refused name"


def _key_for(client: redis.Redis, prefix: str, tenant: str) -> dict[str, str]:
    """An API key for any tenant name, stored as an older deployment (without the reserved list) would have."""
    key = f"ebx_{secrets.token_hex(4)}_{secrets.token_urlsafe(16)}"
    info = {"key_id": key[4:12], "tenant": tenant, "created_at": time.time(), "revoked": False}
    client.set(Keys(prefix).api_key(hashlib.sha256(key.encode()).hexdigest()), json.dumps(info))
    return {"Authorization": f"Bearer {key}"}


SCRIPT = {"name": "tick", "version": "1.0.0", "code": "print(1)", "input_schema": {"type": "object"}}
SCHEDULE = {"script": "tick@1.0.0", "cron": "0 3 * * *", "inputs": {"api_token": "alpha-secret"}}


def test_a_tenant_named_due_or_active_lists_only_its_own(
    settings: Settings, client: redis.Redis, api: tuple[InProcess, dict[str, dict[str, str]]]
) -> None:
    """Finding 7 from the attacker's side: tenants `due` and `active` (keys issued before names were
    reserved) list schedules and runs; alpha's schedule, with its inputs, is not among them."""
    http, as_ = api
    assert http.post("/v1/scripts", json=SCRIPT, headers=as_["alpha"]).status_code == 201
    created = http.post("/v1/schedules", json=SCHEDULE, headers=as_["alpha"])
    assert created.status_code == 201, created.text
    due, active = (_key_for(client, settings.redis.key_prefix, t) for t in ("due", "active"))
    listed = http.get("/v1/schedules", headers=due)
    assert listed.status_code == 200 and listed.json() == [], listed.text
    assert "alpha-secret" not in listed.text
    assert http.get(f"/v1/schedules/{created.json()['id']}", headers=due).status_code == 404
    gated = {"id": "pay", "run": {"code": "print(1)", "language": "python"}, "approval": {"summary": "pay"}}
    run = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [gated]}}, headers=as_["alpha"])
    assert run.status_code in (200, 201, 202), run.text
    keys = Keys(settings.redis.key_prefix)
    assert client.zscore(keys.active_runs, run.json()["id"]) is not None, "alpha's run is in the shared index"
    assert http.get("/v1/runs", headers=active).json() == [], "tenant `active` lists only its own runs"
    assert http.get(f"/v1/runs/{run.json()['id']}", headers=active).status_code == 404
    # their own schedules are theirs
    assert http.post("/v1/scripts", json=SCRIPT, headers=due).status_code == 201
    own = http.post("/v1/schedules", json=SCHEDULE | {"inputs": {"api_token": "due-own"}}, headers=due).json()
    assert [s["id"] for s in http.get("/v1/schedules", headers=due).json()] == [own["id"]]
    assert [s["id"] for s in http.get("/v1/schedules", headers=as_["alpha"]).json()] == [created.json()["id"]]


def _to_old_layout(client: redis.Redis, prefix: str) -> list[str]:
    """Rename every tenant key to its name before tenant namespaces, as an older deployment stored it."""
    moved = []
    for name in client.scan_iter(match=f"{prefix}:t:*", count=1000):
        old = name.decode().replace(f"{prefix}:t:", f"{prefix}:", 1)
        if client.exists(old):  # tenant `due`'s list and the shared index were one key
            client.zunionstore(old, [old, name])
            client.delete(name)
        else:
            client.rename(name, old)
        moved.append(old.removeprefix(f"{prefix}:"))
    return moved


def test_data_of_the_older_layout_is_moved_and_read_back_through_the_api(
    settings: Settings, client: redis.Redis
) -> None:
    prefix = settings.redis.key_prefix
    as_ = {"alpha": {"Authorization": f"Bearer {ApiKeys(client, prefix).create('alpha')[0]}"}}
    http = InProcess(create_app(settings))
    assert http.post("/v1/scripts", json=SCRIPT, headers=as_["alpha"]).status_code == 201
    schedule = http.post("/v1/schedules", json=SCHEDULE, headers=as_["alpha"]).json()
    # a tenant named `due`, from before: its schedule list was the shared index itself
    due = _key_for(client, prefix, "due")
    assert http.post("/v1/scripts", json=SCRIPT, headers=due).status_code == 201
    due_schedule = http.post("/v1/schedules", json=SCHEDULE, headers=due).json()
    http.close()

    old = _to_old_layout(client, prefix)
    assert {"scripts:alpha", "schedules:alpha", "script:alpha:tick"} <= set(old), old
    assert client.zcard(f"{prefix}:schedules:due") == 2, "the shared index holds alpha's and due's"

    http = InProcess(create_app(settings))  # an API start runs the migration
    try:
        assert [s["id"] for s in http.get("/v1/schedules", headers=as_["alpha"]).json()] == [schedule["id"]]
        assert [s["id"] for s in http.get("/v1/schedules", headers=due).json()] == [due_schedule["id"]]
        found = http.get("/v1/scripts", headers=as_["alpha"]).json()
        assert [s["name"] for s in found] == ["tick"]
        detail = http.get(f"/v1/schedules/{schedule['id']}", headers=as_["alpha"]).json()
        assert detail["inputs"] == {"api_token": "alpha-secret"}
    finally:
        http.close()
    moved = ("scripts", "script", "scriptuse", "rate", "active", "idem", "runs", "approvals", "surprises")
    leftovers = [k.decode() for k in client.scan_iter(match=f"{prefix}:*") if k.decode().split(":")[1] in moved]
    assert leftovers == [], "nothing of the older layout left"
    again = migrate(client, Keys(prefix))
    assert (again.moved, again.merged, again.untangled) == (0, 0, 0), "a second run finds nothing to do"


def test_the_migration_merges_into_keys_written_since(settings: Settings, client: redis.Redis) -> None:
    keys, prefix = Keys(settings.redis.key_prefix), settings.redis.key_prefix
    client.zadd(f"{prefix}:runs:alpha", {"run_old": 1.0})
    client.zadd(keys.runs("alpha"), {"run_new": 2.0})
    client.sadd(f"{prefix}:scripts:alpha", "a", "b")
    client.sadd(keys.scripts("alpha"), "c")
    client.hset(f"{prefix}:script:alpha:a", mapping={"1.0.0": "old", "2.0.0": "old"})
    client.hset(keys.script("alpha", "a"), "2.0.0", "new")
    client.set(f"{prefix}:rate:alpha:7", 3, ex=100)
    done = migrate(client, keys)
    assert (done.moved, done.merged) == (1, 3)
    assert client.zrange(keys.runs("alpha"), 0, -1) == [b"run_old", b"run_new"]
    assert client.smembers(keys.scripts("alpha")) == {b"a", b"b", b"c"}
    assert client.hgetall(keys.script("alpha", "a")) == {b"1.0.0": b"old", b"2.0.0": b"new"}
    assert 0 < client.ttl(keys.rate("alpha", 7)) <= 100, "a moved key keeps its expiry"
    assert list(client.scan_iter(match=f"{prefix}:runs:*")) == []


def test_every_fixed_word_of_the_key_schema_is_reserved() -> None:
    """The reserved names are written in tenancy (below the rooms that own the keys): a room's new key
    with a new word must add it there."""
    words = {segment for spec in SCHEMA for segment in spec.pattern.split(":") if not segment.startswith("{")}
    assert sorted(words - RESERVED_TENANTS) == [], "add these to execbox.tenancy.apikeys.KEY_WORDS"
