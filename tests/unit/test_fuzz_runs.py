"""A stateful fuzz run over plans (issue #28): random sequences of create, revise, cancel, usage,
decide and "an execution ended" against the in-process API on a real Redis, with plans, schemas,
numbers and keys drawn from valid and hostile values alike. After every step: no answer was a 5xx,
and every run and approval the tenant has can be read back (its list, and each one by id).

Bounded for CI: a fixed number of examples and steps, derandomized (the same sequences on every
run) and without an example database, so it takes the same ~20 s everywhere.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from execbox.api import create_app
from execbox.core.redis import connect
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.conftest import Redis
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
STEP_IDS = ["a", "b", "c", "d", "e"]
NUMBERS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70),
                    st.sampled_from([1e308, 1.7976931348623157e308, 0.0, -1.0]))  # fmt: skip
"""Any JSON number: most are refused where a field has a range, and must be a 422 there."""


def mostly(valid: list[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value seven times in eight, so that runs get far; a hostile one otherwise."""
    return st.one_of(*[st.sampled_from(valid)] * 7, hostile)


VALID_SCHEMAS = [
    {"type": "object"},
    {"type": "object", "required": ["total"], "properties": {"total": {"type": "integer"}}},
    {"$defs": {"n": {"type": "number"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
]
HOSTILE_SCHEMAS = [{"type": 5}, {"$ref": "#/$defs/missing"}, {"$ref": "https://schemas.example.com/x.json"},
                   {"minimum": "ten"}]  # fmt: skip
SCHEMAS = st.sampled_from(VALID_SCHEMAS * 6 + HOSTILE_SCHEMAS)
"""Mostly schemas that compile, so that runs get far; the hostile ones must be refused with a 422."""


class World:
    """The app, two keys of tenant alpha (one names the approvers), and what the fuzz run saw."""

    def __init__(self, settings_: Settings) -> None:
        self.client = connect(settings_)
        keys = ApiKeys(self.client, settings_.redis.key_prefix)
        self.keys = {name: keys.create("alpha") for name in ("approver", "other")}
        self.http = InProcess(create_app(settings_))
        self.store = ExecutionStore(self.client, settings_)
        self.prefix = settings_.redis.key_prefix
        self.run_keys = self.http.app.state.services.runs.executor.store.keys.run("*")
        self.answers = 0
        self.created = 0

    @staticmethod
    def text(key: Any) -> str:
        return key.decode() if isinstance(key, bytes) else str(key)

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[key][0]}"}

    def request(
        self, method: str, url: str, key: str = "other", headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        sent = {**self.headers(key), **(headers or {})}
        call = self.http.post if method == "POST" else self.http.get
        answer = call(url, headers=sent, **kwargs)
        self.answers += 1
        assert answer.status_code < 500, f"{method} {url}: {answer.status_code} {answer.text[:500]}"
        return answer


def steps(approver: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    step = st.fixed_dictionaries(
        {"id": st.sampled_from(STEP_IDS), "run": st.just({"code": "print(1)"})},
        optional={
            "depends_on": mostly([[]], st.lists(st.sampled_from(STEP_IDS), max_size=2)),
            "args": st.dictionaries(st.sampled_from(["x", "y"]), mostly([1, "text", {"$ref": "/inputs/n"}], st.one_of(
                NUMBERS, st.sampled_from([{"$ref": "/steps/a/outputs/total"}, {"$ref": 3}])))),
            "approval": st.fixed_dictionaries({}, optional={"by": st.sampled_from([[], [approver], ["nobody"]]),
                                                            "expires_in_s": mostly([60, 3600], st.integers(-1, 5))}),
            "postconditions": st.fixed_dictionaries({}, optional={"outputs_schema": SCHEMAS}),
            "preconditions": st.lists(st.fixed_dictionaries({"run": st.just({"code": "print(1)"}),
                                                             "expect": SCHEMAS}), max_size=1),
            "retry": st.fixed_dictionaries({}, optional={"interval_s": mostly([0, 0.5], NUMBERS),
                                                         "max_attempts": mostly([1, 3], st.integers(0, 4))}),
        },
    )  # fmt: skip
    return st.lists(step, min_size=1, max_size=4, unique_by=lambda s: str(s["id"]))


def make_machine(world: World) -> type[RuleBasedStateMachine]:
    approver = world.keys["approver"][1].key_id

    class Runs(RuleBasedStateMachine):
        runs = Bundle("runs")

        @initialize(target=runs)
        def a_gated_run(self) -> str:
            gate = {"id": "a", "run": {"code": "print(1)"}, "approval": {"by": [approver]}}
            then = {"id": "b", "run": {"code": "print(2)"}, "args": {"t": {"$ref": "/steps/a/outputs/total"}}}
            answer = world.request("POST", "/v1/runs", json={"plan": {"format": "plan/v1", "steps": [gate, then]}})
            world.created += answer.status_code == 201
            return str(answer.json()["id"])

        @rule(target=runs, plan_steps=steps(approver), goal=st.one_of(st.none(), SCHEMAS),
              budgets=st.fixed_dictionaries({}, optional={"max_cost_usd": mostly([0.5, 100], NUMBERS),
                                                          "max_steps": mostly([3, 50], st.integers(0, 1001)),
                                                          "max_wall_s": mostly([60, 900], NUMBERS)}))  # fmt: skip
        def create(self, plan_steps: list[dict[str, Any]], goal: Any, budgets: dict[str, Any]) -> str:
            document: dict[str, Any] = {"format": "plan/v1", "steps": plan_steps, "budgets": budgets,
                                        "inputs": {"n": 3}}  # fmt: skip
            if goal is not None:
                document["goal"] = {"step": plan_steps[0]["id"], "outputs_schema": goal}
            answer = world.request("POST", "/v1/runs", json={"plan": document})
            world.created += answer.status_code == 201
            return str(answer.json()["id"]) if answer.status_code == 201 else "run_" + "0" * 26

        @rule(run=runs, add=steps(approver), remove=st.lists(st.sampled_from(STEP_IDS), max_size=2),
              key=st.sampled_from(["approver", "other"]), stale=st.booleans())  # fmt: skip
        def revise(self, run: str, add: list[dict[str, Any]], remove: list[str], key: str, stale: bool) -> None:
            current = world.request("GET", f"/v1/runs/{run}")
            base = 1 if stale or current.status_code != 200 else current.json()["revision"]
            suffix = secrets.token_hex(2)
            for step in add:  # new ids, so that a revision may add them
                step["id"] = f"{step['id']}{suffix}"
            world.request("POST", f"/v1/runs/{run}/revisions", key,
                          json={"base_revision": base, "add": add, "remove": remove, "reason": "fuzz"})  # fmt: skip

        @rule(run=runs)
        def cancel(self, run: str) -> None:
            world.request("POST", f"/v1/runs/{run}/cancel")

        @rule(run=runs, cost=NUMBERS, tokens=st.integers(-1, 2**64), raw=st.booleans())
        def usage(self, run: str, cost: float, tokens: int, raw: bool) -> None:
            if raw:  # a number JSON can carry but a float cannot hold
                world.request("POST", f"/v1/runs/{run}/usage", content=b'{"cost_usd": 1e400}',
                              headers={"Content-Type": "application/json"})  # fmt: skip
            world.request("POST", f"/v1/runs/{run}/usage", json={"cost_usd": cost, "input_tokens": tokens})

        @rule(key=st.sampled_from(["approver", "other"]), decision=st.sampled_from(["approve", "reject"]))
        def decide(self, key: str, decision: str) -> None:
            pending = world.request("GET", "/v1/approvals?status=pending").json()
            if pending:
                world.request("POST", f"/v1/approvals/{pending[0]['id']}/decision", key, json={"decision": decision})

        @rule(run=runs, outcome=st.sampled_from(["succeeded", "failed", "sandbox"]), outputs=st.dictionaries(
            st.sampled_from(["total", "x"]), NUMBERS, max_size=2))  # fmt: skip
        def an_execution_ends(self, run: str, outcome: str, outputs: dict[str, Any]) -> None:
            """What a worker would do: end the run's latest running attempt, then the run is advanced."""
            found = world.request("GET", f"/v1/runs/{run}")
            if found.status_code != 200:
                return
            running = [s for s in found.json()["steps"].values() if s["status"] == "running" and s["attempts"]]
            if not running:
                return
            state = running[0]
            execution_id = state["checks"][-1] if state["phase"] else state["attempts"][-1]

            def end(record: ExecutionRecord) -> ExecutionStatus:
                if outcome == "succeeded":
                    record.outputs = outputs
                    return ExecutionStatus.SUCCEEDED
                category = ErrorCategory.SANDBOX_ERROR if outcome == "sandbox" else ErrorCategory.CODE_EXCEPTION
                record.error = ExecutionError(category=category, message="fuzz", retryable=outcome == "sandbox")
                return ExecutionStatus.FAILED

            def start(record: ExecutionRecord) -> ExecutionStatus:
                record.started_at = time.time()
                return ExecutionStatus.RUNNING

            world.store.transition(execution_id, {ExecutionStatus.QUEUED}, "fuzz", start)
            world.store.transition(execution_id, {ExecutionStatus.RUNNING}, "fuzz", end)
            world.http.app.state.services.runs.executor.advance(run)

        @invariant()
        def everything_stored_reads_back(self) -> None:
            listed = {run["id"] for run in world.request("GET", "/v1/runs").json()}
            stored = {world.text(k).rsplit(":", 1)[-1] for k in world.client.scan_iter(match=world.run_keys)}
            assert stored == listed, "every stored run is in the tenant's list, and nothing else"
            for run_id in stored:
                assert world.request("GET", f"/v1/runs/{run_id}").status_code == 200
            for approval in world.request("GET", "/v1/approvals").json():
                assert world.request("GET", f"/v1/approvals/{approval['id']}").status_code == 200

        def teardown(self) -> None:
            """The next example starts without this one's runs and approvals. Each run goes under its
            own lock: the app's plan loop may be advancing it (an execution of it just ended), and a
            holder that read it before a bare delete stores it again after (seen once in CI)."""
            store = world.http.app.state.services.runs.executor.store
            keys = store.keys
            for key in list(world.client.scan_iter(match=keys.run("*"))):
                with store.locked(world.text(key).rsplit(":", 1)[-1]):
                    world.client.delete(key)
            doomed = list(world.client.scan_iter(match=keys.approval("*")))
            world.client.delete(keys.runs("alpha"), keys.approvals("alpha"), keys.active_runs, *doomed)

    return Runs


def test_random_run_histories_never_answer_5xx_and_stay_readable(redis_server: Redis, tmp_path: Path) -> None:
    prefix = f"u{secrets.token_hex(4)}"
    world = World(Settings(redis={"url": redis_server.url, "key_prefix": prefix}, queue={"name": prefix},
                           artifacts_dir=tmp_path / "artifacts"))  # fmt: skip
    started = time.monotonic()
    try:
        run_state_machine_as_test(
            make_machine(world),
            settings=settings(
                max_examples=30,
                stateful_step_count=20,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),  # fmt: skip
        )
    finally:
        world.http.close()
        for key in world.client.scan_iter(match=f"{prefix}:*", count=1000):
            world.client.delete(key)
        world.client.close()
    elapsed = time.monotonic() - started
    figures = f"{world.answers} answers ({world.created} runs created), none a 5xx"
    sys.stderr.write(f"\nfuzz: {figures}, every stored run and approval read back, in {elapsed:.1f} s\n")
    assert world.answers > 500 and world.created > 30 and elapsed < 120, (world.answers, world.created, elapsed)
