"""The worked examples (examples/) against the live service: each scenario's trace (the whole
conversation, what the service answered, the outcome) must be the saved one. A change in the
service that changes what an agent would have seen or done shows here as a differing trace;
`python examples/<name>.py --record` saves them anew after a deliberate change."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from execbox_client import Client

from tests.conftest import Stack

pytestmark = [pytest.mark.docker, pytest.mark.redis]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
CASES = sorted((p.parent.name, p.stem) for p in (EXAMPLES / "traces").glob("*/*.json"))


def test_every_example_has_its_three_traces() -> None:
    untraced = {"agent", "e2b_quickstart"}  # the agent runs the others; the E2B quick-start is its own test
    names = sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem not in untraced)
    assert names == ["analysis_agent", "instrument_logs", "sql_plan", "subsidiaries"]
    for name in names:
        assert sorted(importlib.import_module(name).SCENARIOS) == ["escalate", "recoverable", "success"], name
        assert [case for case in CASES if case[0] == name] == [
            (name, s) for s in ("escalate", "recoverable", "success")
        ]


@pytest.mark.parametrize(("example", "scenario"), CASES, ids=[f"{e}-{s}" for e, s in CASES])
def test_a_saved_trace_of_an_example_replays(stack: Stack, example: str, scenario: str) -> None:
    saved: dict[str, Any] = json.loads((EXAMPLES / "traces" / example / f"{scenario}.json").read_text())
    with Client(stack.base_url, stack.keys["alpha"]) as box:
        trace = importlib.import_module(example).SCENARIOS[scenario](box).record()
    assert trace["service"] == saved["service"], "the service answered otherwise"
    assert trace["messages"] == saved["messages"], "the conversation went otherwise"
    assert trace == saved
    expected = {"success": {"answer", "quiet"}, "recoverable": {"answer"}, "escalate": {"escalated"}}[scenario]
    assert trace["outcome"]["kind"] in expected, trace["outcome"]
