"""The clients core/sentinel.py builds, without a server: which Sentinels they ask, for which
primary, and as whom (the role's credentials on the Sentinels and on the data nodes alike)."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.core import sentinel

TARGET = sentinel.parse("sentinel://worker:pw@h1:26379,h2:26380/execbox?db=3")


def _pool(client: Any) -> Any:
    return client.connection_pool


@pytest.mark.parametrize("build", [sentinel.sync_client, sentinel.async_client])
def test_the_client_asks_every_sentinel_for_the_named_primary_as_the_role(build: Any) -> None:
    pool = _pool(build(TARGET, socket_timeout_s=2.5))
    assert pool.service_name == "execbox"
    assert pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"], kwargs["socket_timeout"]) == (3, "worker", "pw", 2.5)
    asked = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(k["host"], k["port"], k["username"], k["password"]) for k in asked] == [
        ("h1", 26379, "worker", "pw"),
        ("h2", 26380, "worker", "pw"),
    ]
    assert all(k["socket_connect_timeout"] == 2.5 for k in asked)  # no Sentinel waited on without a bound
