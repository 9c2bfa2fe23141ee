"""The outbox stream's consumer groups keep the names Redis already keeps (that each is a declared
loop, read per queue only for plans: tests/unit/test_architecture.py)."""

from __future__ import annotations

from execbox.executions.events import consumer_group


def test_consumer_group_names_are_the_ones_a_running_stack_stored() -> None:
    # A group's place in the stream is stored under its name: these strings must never change.
    assert consumer_group("webhooks") == "webhooks"
    assert consumer_group("surprises") == "surprises"
    assert consumer_group("plans", "default") == "plans.default"
