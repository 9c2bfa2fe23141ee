"""Sandbox uids reserved in Redis (execbox.sandbox.uids.redis_uids) across a Redis outage: a
Sentinel fail-over leaves no primary for a few seconds, and a reservation refused then failed the
execution about to run (sandbox.error, seen in the cluster's fail-over test). A stand-in client
fails as redis-py does while no primary answers."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from execbox.core.errors import QueueUnavailable
from execbox.sandbox.keys import SandboxKeys
from execbox.sandbox.uids import redis_uids


class _FailingOver:
    """SET fails with a reset connection `failures` times, then answers as Redis does."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def set(self, *args: Any, **kwargs: Any) -> bool:
        self.calls += 1
        if self.calls <= self.failures:
            raise redis.ConnectionError("Error 104 while writing to socket. Connection reset by peer.")
        return True


def test_a_reservation_waits_through_a_short_outage() -> None:
    client = _FailingOver(failures=2)
    uids = redis_uids(client, SandboxKeys("t"), "200000-200009", patience_s=5.0)  # type: ignore[arg-type]
    assert 200000 <= uids.reserve() <= 200009
    assert client.calls == 3


def test_an_outage_longer_than_the_patience_is_reported_not_waited_out() -> None:
    client = _FailingOver(failures=100)
    uids = redis_uids(client, SandboxKeys("t"), "200000-200009", patience_s=0.5)  # type: ignore[arg-type]
    with pytest.raises(QueueUnavailable):
        uids.reserve()
    assert 2 <= client.calls < 10
