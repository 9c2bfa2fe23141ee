"""Steps that need Redis, tried again through a Sentinel fail-over (issue 30): a finished run stores its outcome."""

from __future__ import annotations

import pytest

from execbox.core.errors import QueueUnavailable
from execbox.core.redis import through_outage


def test_a_step_that_fails_while_redis_has_no_primary_is_tried_again_until_it_answers() -> None:
    calls = []

    def step() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise QueueUnavailable("Redis is unreachable or failing (No master found); retry shortly")
        return "stored"

    assert through_outage("storing", step, patience_s=5) == "stored"
    assert len(calls) == 3


def test_past_its_patience_the_outage_error_stands() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        raise QueueUnavailable("Redis is unreachable or failing; retry shortly")

    with pytest.raises(QueueUnavailable):
        through_outage("storing", step, patience_s=0.5)
    assert 2 <= len(calls) <= 4  # 0.2 s, then 0.4 s would pass the deadline


def test_other_errors_are_not_retried() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        through_outage("storing", step, patience_s=5)
    assert calls == [1]
