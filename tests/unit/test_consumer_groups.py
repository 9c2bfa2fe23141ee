"""The outbox stream's consumer groups are named in one place, with the names Redis already keeps."""

from __future__ import annotations

import pytest

from execbox.executions.events import DURABLE_GROUPS, consumer_group


def test_consumer_group_names_are_the_ones_a_running_stack_stored() -> None:
    # A group's place in the stream is stored under its name: these strings must never change.
    assert consumer_group("webhooks") == "webhooks"
    assert consumer_group("surprises") == "surprises"
    assert consumer_group("plans", "default") == "plans.default"
    assert DURABLE_GROUPS == ("webhooks", "plans", "surprises")


def test_consumer_group_refuses_an_unknown_consumer_or_a_wrong_queue() -> None:
    with pytest.raises(ValueError, match="unknown consumer"):
        consumer_group("schedules")
    with pytest.raises(ValueError, match="per queue"):
        consumer_group("plans")
    with pytest.raises(ValueError, match="one group"):
        consumer_group("webhooks", "default")
