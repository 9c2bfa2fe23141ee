"""EXECBOX_REDIS__PASSWORD_FILE: a role's password read from a secret file into the Redis URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from execbox.core.settings import RedisSettings


def test_the_password_file_replaces_the_urls_password_and_keeps_its_user(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr/t:@x\n")
    section = RedisSettings(url="redis://worker:old@redis:6379/0", password_file=secret)
    assert section.url == "redis://worker:s3cr%2Ft%3A%40x@redis:6379/0"
    assert section.password_file is None


def test_a_sentinel_url_takes_the_password_file_too(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("abc")
    section = RedisSettings(url="sentinel://api@s1:26379,s2:26379/execbox?db=0", password_file=secret)
    assert section.url == "sentinel://api:abc@s1:26379,s2:26379/execbox?db=0"


def test_a_url_without_user_gets_the_default_user(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("abc")
    assert RedisSettings(url="redis://redis:6379/0", password_file=secret).url == "redis://default:abc@redis:6379/0"


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_missing_or_empty_password_file_is_refused_naming_the_setting(tmp_path: Path, content: str | None) -> None:
    secret = tmp_path / "pw"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ValidationError) as caught:
        RedisSettings(url="redis://api:x@redis:6379/0", password_file=secret)
    assert "redis.password_file" in str(caught.value)
    assert "x@redis" not in str(caught.value)
