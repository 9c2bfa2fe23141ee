"""The outbox stream's consumer groups: each named by the room that consumes, with the names Redis
already keeps."""

from __future__ import annotations

import ast
from pathlib import Path

from execbox.executions.events import consumer_group
from execbox.keyschema import LOOPS

SERVICE = Path(__file__).resolve().parents[2] / "service" / "execbox"


def consumer_groups_named() -> dict[str, int]:
    """Each consumer the service's code names a group for, with how many arguments it gives (2: per queue)."""
    named = {}
    for path in sorted(SERVICE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called != "consumer_group":
                continue
            given = [*node.args, *(k.value for k in node.keywords)]
            first = given[0] if given else None
            # A name that is not a literal could be anything: the test names each call it cannot read.
            name = first.value if isinstance(first, ast.Constant) else f"<not a literal: {path.name}:{node.lineno}>"
            named[str(name)] = len(given)
    return named


def test_consumer_group_names_are_the_ones_a_running_stack_stored() -> None:
    # A group's place in the stream is stored under its name: these strings must never change.
    assert consumer_group("webhooks") == "webhooks"
    assert consumer_group("surprises") == "surprises"
    assert consumer_group("plans", "default") == "plans.default"


def test_every_consumer_group_is_a_declared_loop_and_only_plans_is_read_per_queue() -> None:
    named = consumer_groups_named()

    assert named == {"webhooks": 1, "plans": 2, "surprises": 1}, named
    assert named.keys() <= set(LOOPS), LOOPS
