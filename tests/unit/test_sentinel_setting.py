"""The `sentinel://` setting: what it names, and refusals that name the part at fault without
repeating a password."""

from __future__ import annotations

import pytest

from execbox.core.redis_roles import role_url
from execbox.core.sentinel import SentinelTarget, is_sentinel_url, parse


def test_three_sentinels_master_db_and_role_credentials() -> None:
    target = parse("sentinel://worker:s3cret@10.0.0.1:26379,10.0.0.2:26380,redis-3:26381/execbox?db=2")
    assert target == SentinelTarget(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("redis-3", 26381)),
        master="execbox",
        db=2,
        username="worker",
        password="s3cret",
    )


def test_without_credentials_port_or_db_the_defaults_hold() -> None:
    target = parse("sentinel://a,b:1/m")
    assert target.sentinels == (("a", 26379), ("b", 1))
    assert (target.master, target.db, target.username, target.password) == ("m", 0, None, None)


def test_percent_encoded_credentials_and_ipv6_hosts() -> None:
    target = parse("sentinel://api:p%40ss%3Aw%2Fd@[::1]:26379,[fe80::2]/mymaster")
    assert (target.username, target.password) == ("api", "p@ss:w/d")
    assert target.sentinels == (("::1", 26379), ("fe80::2", 26379))


def test_role_url_puts_a_role_into_a_sentinel_setting() -> None:
    url = role_url("sentinel://old:x@h1:26379,h2:26379/execbox?db=0", "worker", "pw/1")
    target = parse(url)
    assert (target.username, target.password, target.sentinels[1]) == ("worker", "pw/1", ("h2", 26379))


def test_the_password_never_shows_in_the_repr() -> None:
    assert "s3cret" not in repr(parse("sentinel://worker:s3cret@h:1/m"))


def test_only_the_sentinel_scheme_is_recognised() -> None:
    assert is_sentinel_url("sentinel://h/m") and is_sentinel_url("SENTINEL://h/m")
    assert not is_sentinel_url("redis://h:6379/0")


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis://h:6379/0", "sentinel://"),
        ("h1:26379/m", "sentinel://"),
        ("sentinel:///m", "no Sentinel address"),
        ("sentinel://user:pw@/m", "no Sentinel address"),
        ("sentinel://h1,,h2/m", "address 2 is empty"),
        ("sentinel://h1,/m", "address 2 is empty"),
        ("sentinel://:26379/m", "address 1 has no host"),
        ("sentinel://h1:abc/m", "port 'abc'"),
        ("sentinel://h1:0/m", "port '0'"),
        ("sentinel://h1:1,h2:65536/m", "address 2: port '65536'"),
        ("sentinel://h1:-1/m", "port '-1'"),
        ("sentinel://h1:２６３７９/m", "port"),
        ("sentinel://h1:1:2/m", "IPv6 host in brackets"),
        ("sentinel://[::1/m", "closing ']'"),
        ("sentinel://[::1]x/m", "':<port>' after ']'"),
        ("sentinel://h1,h1/m", "twice"),
        ("sentinel://h1:26379", "names no master"),
        ("sentinel://h1:26379/", "names no master"),
        ("sentinel://h1:26379/?db=0", "names no master"),
        ("sentinel://h1/a/b", "slash or a space"),
        ("sentinel://h1/m?db=x", "db 'x'"),
        ("sentinel://h1/m?db=-1", "db '-1'"),
        ("sentinel://h1/m?password=x", "unknown option 'password'"),
        ("sentinel://h1/m#frag", "fragment"),
    ],
)
def test_hostile_settings_are_refused_naming_the_part(url: str, names: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse(url)
    assert names in str(refused.value)


def test_a_refusal_does_not_repeat_the_password() -> None:
    with pytest.raises(ValueError) as refused:
        parse("sentinel://worker:topsecret@h1:bad/m")
    assert "topsecret" not in str(refused.value)
