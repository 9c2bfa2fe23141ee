"""The console's pure parts: a plan's layout, and sign-ins against a real Redis."""

from __future__ import annotations

import hashlib

import pytest
import redis

from execbox.api.console.graph import BOX_W, layout
from execbox.keyschema import Keys
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.errors import InvalidKey
from execbox.tenancy.signins import OPERATOR, SIGNIN_TTL_S, SignIns


def test_a_step_sits_one_column_after_its_deepest_dependency() -> None:
    drawn = layout({"a": set(), "b": {"a"}, "c": {"a"}, "d": {"b", "c"}, "e": {"a", "d"}}, {"a": "succeeded"})
    columns = {n.id: n.x // BOX_W for n in drawn.nodes}
    assert [columns[s] for s in "abcde"] == sorted(columns[s] for s in "abcde")
    by_id = {n.id: n for n in drawn.nodes}
    assert by_id["b"].x == by_id["c"].x and by_id["b"].y != by_id["c"].y, "siblings share a column, not a row"
    assert by_id["e"].x > by_id["d"].x > by_id["b"].x > by_id["a"].x
    assert by_id["a"].status == "succeeded" and by_id["e"].status == "pending"
    assert len(drawn.edges) == 6 and drawn.width >= by_id["e"].x + BOX_W


def test_unknown_dependencies_and_long_ids_do_not_break_the_layout() -> None:
    long_id = "s" * 64
    drawn = layout({long_id: {"gone"}, "b": {long_id}}, {})
    assert [n.label for n in drawn.nodes][0] == "s" * 21 + "…"
    assert len(drawn.edges) == 1


def test_a_thousand_chained_steps_are_laid_out_in_a_thousand_columns() -> None:
    chain = {f"s{i}": ({f"s{i + 1}"} if i < 999 else set()) for i in range(1000)}
    drawn = layout(chain, {})
    assert sorted(n.x for n in drawn.nodes) == sorted({n.x for n in drawn.nodes}), "one step per column"
    assert {n.id: n.x for n in drawn.nodes}["s999"] < {n.id: n.x for n in drawn.nodes}["s0"]


def _signins(client: redis.Redis, settings: Settings) -> tuple[SignIns, ApiKeys]:
    keys = ApiKeys(client, settings.redis.key_prefix)
    return SignIns(client, Keys(settings.redis.key_prefix), keys), keys


def test_a_sign_in_holds_its_keys_tenant_until_the_key_is_revoked(client: redis.Redis, settings: Settings) -> None:
    signins, keys = _signins(client, settings)
    key, info = keys.create("alpha")
    token, started = signins.start(key, None)
    assert token != key and key not in token
    read = signins.read(token, None)
    assert read is not None and (read.tenant, read.key_id) == ("alpha", info.key_id) and not read.operator
    stored = list(client.scan_iter(match=f"{settings.redis.key_prefix}:console:*"))
    assert len(stored) == 1 and 0 < client.ttl(stored[0]) <= SIGNIN_TTL_S
    at_rest = str(client.get(stored[0])) + str(stored[0])
    assert key not in at_rest and token not in at_rest, "neither key nor token at rest"
    keys.revoke(info.key_id)
    assert signins.read(token, None) is None


def test_the_admin_token_signs_in_the_operator_until_it_changes(client: redis.Redis, settings: Settings) -> None:
    signins, _ = _signins(client, settings)
    token, started = signins.start("the-admin-token", "the-admin-token")
    assert started.operator and started.key_id == OPERATOR and started.tenant == ""
    assert signins.read(token, "the-admin-token") is not None
    assert signins.read(token, "a-new-admin-token") is None and signins.read(token, None) is None
    (stored,) = client.scan_iter(match=f"{settings.redis.key_prefix}:console:*")
    at_rest = str(client.get(stored))
    assert hashlib.sha256(b"the-admin-token").hexdigest() not in at_rest and "the-admin-token" not in at_rest


def test_unknown_tokens_keys_and_ended_sign_ins_are_refused(client: redis.Redis, settings: Settings) -> None:
    signins, keys = _signins(client, settings)
    for garbage in (None, "", "x" * 5000, "not-a-token"):
        assert signins.read(garbage, None) is None
    with pytest.raises(InvalidKey):
        signins.start("ebx_00000000_nothing", "admin")
    key, _ = keys.create("alpha")
    token, _ = signins.start(key, None)
    signins.end(token)
    assert signins.read(token, None) is None
