"""The Redis roles' key and channel patterns follow from the key rows: a new row needs no edit in core."""

from __future__ import annotations

import pytest

from execbox.core.keys import KeySpec
from execbox.core.redis_roles import roles


def _row(
    pattern: str, write: tuple[str, ...], read: tuple[str, ...] = (), kind: str = "string", **extra: tuple[str, ...]
) -> KeySpec:
    return KeySpec(pattern, kind, "none", write, read, "a key", **extra)


def test_a_new_rows_key_reaches_its_writers_and_readers_only() -> None:
    granted = roles("p", [_row("widget:{id}:parts", ("api",), ("worker",))])
    assert "~p:widget:*" in granted["api"].keys
    assert "%R~p:widget:*" in granted["worker"].keys
    assert not any("widget" in k for k in (*granted["egress"].keys, *granted["admin"].keys, *granted["scaler"].keys))


def test_a_write_only_writer_may_not_read() -> None:
    granted = roles("p", [_row("refusals:{id}", ("egress",), ("api",), write_only=("egress",))])
    assert granted["egress"].keys == ("%W~p:refusals:*",)
    assert granted["api"].keys[0] == "%R~p:refusals:*"


def test_a_key_under_a_pattern_already_granted_adds_none() -> None:
    granted = roles("p", [_row("box:{id}", ("api",)), _row("box:live", ("api",)), _row("box:{id}:lock", ("api",))])
    assert [k for k in granted["api"].keys if "box" in k] == ["~p:box:*"]


def test_pub_sub_rows_give_channels() -> None:
    granted = roles(
        "p",
        [_row("ping:{id}", ("api",), kind="pub/sub channel"), _row("claim:{id}", ("api",), kind="string + pub/sub")],
    )
    assert granted["api"].channels == ("p:ping:*", "p:claim:*")
    assert "~p:claim:*" in granted["api"].keys and not any("ping" in k for k in granted["api"].keys)


def test_a_row_naming_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        roles("p", [_row("x:{id}", ("janitor",))])
