"""Issue 44 (low): console sign-in had no throttle, so a weak admin token could be guessed at any speed.
Failed sign-ins are counted in Redis (shared by every API process): one address gets FAILURES_PER_SOURCE
tries a window, admin-token guesses from all addresses ADMIN_FAILURES; past either the try is refused
with 429 and Retry-After without being checked."""

from __future__ import annotations

import httpx
import pytest
import redis
from pydantic import SecretStr

from execbox.api import create_app
from execbox.keyschema import Keys
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.tenancy.errors import InvalidKey, SignInThrottled
from execbox.tenancy.signins import ADMIN_FAILURES, FAILURE_WINDOW_S, FAILURES_PER_SOURCE, SignIns
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
ADMIN = "weak-admin"


def console(settings: Settings, address: str) -> InProcess:
    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": SecretStr(ADMIN)})})
    return InProcess(create_app(admin), (address, 40000))


def sign_in(http: InProcess, key: str) -> httpx.Response:
    return http.post("/console/signin", data={"key": key}, headers={"Origin": "http://execbox.test"})


def test_an_address_past_its_failures_is_refused_with_retry_after_even_with_the_right_token(
    settings: Settings, client: redis.Redis
) -> None:
    attacker, other = console(settings, "203.0.113.7"), console(settings, "198.51.100.9")
    try:
        tries = [sign_in(attacker, f"ebx_guess_{i}").status_code for i in range(FAILURES_PER_SOURCE)]
        refused = sign_in(attacker, ADMIN)
        elsewhere = sign_in(other, ADMIN)
    finally:
        attacker.close()
        other.close()

    assert tries == [401] * FAILURES_PER_SOURCE
    assert refused.status_code == 429, refused.text
    assert 0 < int(refused.headers["Retry-After"]) <= FAILURE_WINDOW_S
    assert "set-cookie" not in refused.headers, "a refused try is not checked"
    assert elsewhere.status_code == 303 and "set-cookie" in elsewhere.headers, "another address signs in"


def test_admin_token_guesses_from_many_addresses_are_bounded_together_and_keys_still_sign_in(
    settings: Settings, client: redis.Redis
) -> None:
    api_keys = ApiKeys(client, settings.redis.key_prefix)
    signins = SignIns(client, Keys(settings.redis.key_prefix), api_keys)
    key, _ = api_keys.create("alpha")
    for i in range(ADMIN_FAILURES):  # a botnet: one guess per address, under every address's own bound
        with pytest.raises(InvalidKey):
            signins.start(f"guess-{i}", ADMIN, f"192.0.2.{i}")

    with pytest.raises(SignInThrottled) as throttled:
        signins.start(ADMIN, ADMIN, "192.0.2.250")  # not checked, even the right one
    _, started = signins.start(key, ADMIN, "192.0.2.251")

    assert throttled.value.headers["Retry-After"] == str(throttled.value.retry_after_s)
    assert started.tenant == "alpha", "a tenant's API key is not an admin-token guess"
