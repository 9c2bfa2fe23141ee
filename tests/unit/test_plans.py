"""Plans and runs in-process against a real Redis: validation, the DAG's dispatch order, failure
propagation, retries, unknown outcomes, approvals, revisions and budgets. A step's execution that
succeeds or fails in its program runs through the worker's code with the in-memory sandbox
(execbox.sandbox.fake); infrastructure failures and executions that never started are settled by
hand. Whole plans through the API on the in-process stack are in test_plans_in_process.py; one
end-to-end plan and the tests that kill a worker run against real sandboxes in
tests/integration/test_plans.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from execbox.api import create_app
from execbox.core.tracing import TraceContext
from execbox.executions.lifecycle import run_and_finish
from execbox.executions.lifecycle import take as start_execution
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError, Origin
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.keyschema import Keys
from execbox.plans.executor import Executor
from execbox.sandbox.fake import FakeRuntime, Script
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from execbox.worker.context import WorkerContext
from tests.conftest import wait_until
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]


def cell(code: str = "print(1)") -> dict[str, Any]:
    return {"code": code, "language": "python"}


def plan(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"format": "plan/v1", "steps": list(steps), **extra}


class Harness:
    """Runs through the API; each step's execution is ended when the test says, by the worker's code
    with a fake sandbox playing the program's part (or by hand, for what no program can cause)."""

    def __init__(self, api: Api, settings: Settings, client: redis.Redis) -> None:
        self.http, headers = api
        self.headers = headers["alpha"]
        self.store = ExecutionStore(client, settings)
        self.client = client
        self.keys = Keys(settings.redis.key_prefix)
        self.sandbox = FakeRuntime()
        self.worker = WorkerContext.build(settings, "w-plans", self.sandbox)

    @property
    def executor(self) -> Executor:
        executor: Executor = self.http.app.state.services.runs.executor
        return executor

    def start(self, document: dict[str, Any]) -> dict[str, Any]:
        created = self.http.post("/v1/runs", json={"plan": document}, headers=self.headers)
        assert created.status_code == 201, created.text
        body: dict[str, Any] = created.json()
        return body

    def run(self, run_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.http.get(f"/v1/runs/{run_id}", headers=self.headers).json()
        return body

    def statuses(self, run_id: str) -> dict[str, str]:
        return {step: state["status"] for step, state in self.run(run_id)["steps"].items()}

    def finish(self, run_id: str, step: str, outputs: dict[str, Any] | None = None,
               category: ErrorCategory | None = None, started: bool = True) -> None:  # fmt: skip
        """End the step's current execution (its running check's, or its latest attempt's:
        succeeded with outputs, or failed with category), then advance the run as the consumer would."""
        state = self.run(run_id)["steps"][step]
        execution_id = state["checks"][-1] if state["phase"] else state["attempts"][-1]
        program = _PROGRAM_ENDS.get(category)
        if program is not None and started:  # something a program does: the worker runs it in the fake
            self.sandbox.scripts[execution_id] = program(outputs)
            record = start_execution(self.worker, execution_id)
            assert record is not None, "the execution was queued"
            run_and_finish(self.worker, record, TraceContext(record.trace_id, "0" * 16))
            self.executor.advance(run_id)
            return

        def start(record: ExecutionRecord) -> ExecutionStatus:
            record.started_at = time.time() if started else None
            return ExecutionStatus.RUNNING

        def end(record: ExecutionRecord) -> ExecutionStatus:
            if category is None:
                record.outputs = outputs or {}
                return ExecutionStatus.SUCCEEDED
            record.error = ExecutionError(category=category, message=f"{category.value} (test)", retryable=False)
            return ExecutionStatus.FAILED

        self.store.transition(execution_id, {ExecutionStatus.QUEUED}, "test", start)
        assert self.store.transition(execution_id, {ExecutionStatus.RUNNING}, "test", end) is not None
        self.executor.advance(run_id)

    def executions_of(self, run_id: str, step: str) -> list[str]:
        attempts: list[str] = self.run(run_id)["steps"][step]["attempts"]
        return attempts


_PROGRAM_ENDS: dict[ErrorCategory | None, Callable[[dict[str, Any] | None], Script]] = {
    None: lambda outputs: Script(outputs=outputs or {}),
    ErrorCategory.CHECK_FAILED: lambda outputs: Script(check={"message": "check.failed (test)"}),
    ErrorCategory.CODE_EXCEPTION: lambda outputs: Script(stderr="Traceback:\nValueError: (test)\n", exit_code=1),
}
"""How a program ends its execution each way (the others are settled by hand)."""


@pytest.fixture
def plans(api: Api, settings: Settings, client: redis.Redis) -> Iterator[Harness]:
    harness = Harness(api, settings, client)
    yield harness
    harness.worker.store.redis.close()


def test_a_bad_plan_gets_every_problem_at_once_and_stores_nothing(plans: Harness) -> None:
    bad = plan(
        {"id": "a", "run": cell(), "args": {"x": {"$ref": "/steps/nope/outputs/y"}}},
        {"id": "b", "run": cell(), "depends_on": ["c"]},
        {"id": "c", "run": cell(), "depends_on": ["b"]},
        {"id": "w", "run": cell(), "effect": "write"},
        {"id": "a", "run": cell()},
        {"id": "i", "run": cell(), "args": {"v": {"$ref": "/inputs/missing"}}},
        {"id": "p", "run": cell(), "policy": {"memory_mb": 1 << 19}},
        {"id": "s", "run": {"script": "reports.weekly@1.0.0"}},
    )
    answer = plans.http.post("/v1/plans/validate", json=bad, headers=plans.headers)
    created = plans.http.post("/v1/runs", json={"plan": bad}, headers=plans.headers)

    assert answer.status_code == 422 and answer.json()["code"] == "plan.invalid"
    fields = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert "no step 'nope'" in fields["plan.steps.0.args.x"]
    assert "cycle" in fields["plan.steps"]
    assert "write step must declare" in fields["plan.steps.3.idempotency"]
    assert "used twice" in fields["plan.steps.4.id"]
    assert "no input 'missing'" in fields["plan.steps.5.args.v"]
    assert "plan.steps.6.policy.memory_mb" in fields
    assert "no script reports.weekly@1.0.0" in fields["plan.steps.7.run.script"]
    assert created.status_code == 422 and created.json()["errors"] == answer.json()["errors"]
    assert not list(plans.client.scan_iter(match=plans.keys.run("*"))), "a refused plan stores nothing"


def test_oversized_and_deeply_nested_plans_are_refused(plans: Harness) -> None:
    huge = plan(*({"id": f"s{i}", "run": cell()} for i in range(10_000)))
    deep: Any = {"$ref": "/inputs/x"}
    for _ in range(40):
        deep = [deep]
    nested = plan({"id": "a", "run": cell(), "args": {"deep": deep}}, inputs={"x": 1})

    too_many = plans.http.post("/v1/plans/validate", json=huge, headers=plans.headers)
    too_deep = plans.http.post("/v1/plans/validate", json=nested, headers=plans.headers)
    no_fit = plans.http.post("/v1/plans/validate", json=plan(*({"id": f"s{i}", "run": cell()} for i in range(3)),
                             budgets={"max_steps": 2}), headers=plans.headers)  # fmt: skip

    assert too_many.status_code == 422 and too_many.json()["errors"][0]["field"].endswith("steps")
    assert too_deep.status_code == 422 and "deeper than 32" in too_deep.json()["errors"][0]["message"]
    assert no_fit.status_code == 422 and no_fit.json()["errors"][0]["field"] == "plan.budgets.max_steps"


def test_steps_run_in_dependency_order_with_outputs_passed_by_reference(plans: Harness) -> None:
    run = plans.start(plan(
        {"id": "fetch", "run": cell(), "args": {"n": {"$ref": "/inputs/n"}}},
        {"id": "double", "run": cell(), "args": {"rows": {"$ref": "/steps/fetch/outputs/rows"}}},
        inputs={"n": 3},
    ))  # fmt: skip
    assert plans.statuses(run["id"]) == {"fetch": "running", "double": "pending"}
    first = plans.store.get(plans.executions_of(run["id"], "fetch")[0])
    assert first is not None and first.inputs == {"n": 3} and first.origin == Origin(run=run["id"], step="fetch")
    assert first.context["idempotency_key"] == f"{run['id']}:fetch" and first.trace_id == run["trace_id"]

    plans.finish(run["id"], "fetch", {"rows": [1, 2, 3]})

    second = plans.store.get(plans.executions_of(run["id"], "double")[0])
    assert second is not None and second.inputs == {"rows": [1, 2, 3]}, "the output keeps its JSON type"
    plans.finish(run["id"], "double", {"total": 6})
    done = plans.run(run["id"])
    assert done["status"] == "succeeded" and done["stop_reason"] == "completed"
    assert done["usage"]["steps_dispatched"] == 2


def test_a_failed_branch_invalidates_its_dependants_while_independent_ones_finish(plans: Harness) -> None:
    run = plans.start(plan(
        {"id": "a", "run": cell()},
        {"id": "b", "run": cell(), "depends_on": ["a"]},
        {"id": "c", "run": cell(), "depends_on": ["a"]},
        {"id": "d", "run": cell(), "depends_on": ["b", "c"]},
    ))  # fmt: skip
    plans.finish(run["id"], "a")
    assert plans.statuses(run["id"]) == {"a": "succeeded", "b": "running", "c": "running", "d": "pending"}

    plans.finish(run["id"], "c", category=ErrorCategory.CHECK_FAILED)
    assert plans.run(run["id"])["status"] == "running", "b still runs"
    plans.finish(run["id"], "b")

    final = plans.run(run["id"])
    assert plans.statuses(run["id"]) == {"a": "succeeded", "b": "succeeded", "c": "failed", "d": "upstream_failed"}
    assert final["status"] == "needs_replan" and final["stop_reason"] == "step_failed"
    handoff = plans.http.get(f"/v1/runs/{run['id']}/handoff", headers=plans.headers).json()
    assert [s["step_id"] for s in handoff["completed"]] == ["a", "b"]
    assert [(s["step_id"], s["error"]["category"]) for s in handoff["failed"]] == [("c", "check.failed")]
    assert [s["step_id"] for s in handoff["invalidated"]] == ["d"] and handoff["invalidated"][0]["blocked_by"] == ["c"]


def test_a_revision_continues_without_rerunning_completed_steps(plans: Harness) -> None:
    run = plans.start(plan(
        {"id": "schema", "run": cell()},
        {"id": "query", "run": cell(), "args": {"s": {"$ref": "/steps/schema/outputs/tables"}}},
    ))  # fmt: skip
    plans.finish(run["id"], "schema", {"tables": ["t"]})
    plans.finish(run["id"], "query", category=ErrorCategory.CODE_EXCEPTION)
    assert plans.run(run["id"])["status"] == "needs_replan"
    stale = plans.http.post(f"/v1/runs/{run['id']}/revisions", json={"base_revision": 7}, headers=plans.headers)
    bad_ref = {
        "base_revision": 1,
        "add": [{"id": "q2", "run": cell(), "args": {"x": {"$ref": "/steps/query/outputs/q"}}}],
    }
    refused = plans.http.post(f"/v1/runs/{run['id']}/revisions", json=bad_ref, headers=plans.headers)

    revised = plans.http.post(f"/v1/runs/{run['id']}/revisions", json={
        "base_revision": 1, "reason": "query was wrong",
        "add": [{"id": "query2", "run": cell(), "args": {"s": {"$ref": "/steps/schema/outputs/tables"}}}],
    }, headers=plans.headers)  # fmt: skip

    assert stale.status_code == 409 and refused.status_code == 422
    assert "query" in refused.json()["errors"][0]["message"] and "failed" in refused.json()["errors"][0]["message"]
    assert revised.status_code == 200, revised.text
    assert revised.json()["revision"] == 2 and revised.json()["steps"]["query"]["status"] == "superseded"
    plans.finish(run["id"], "query2", {"rows": 1})
    final = plans.run(run["id"])
    assert final["status"] == "succeeded" and final["usage"]["replans"] == 1
    assert len(final["steps"]["schema"]["attempts"]) == 1, "the completed step ran once"


def test_transient_failures_retry_safe_steps_and_unknown_outcomes_wait_for_reconcile(plans: Harness) -> None:
    run = plans.start(plan(
        {"id": "read", "run": cell(), "retry": {"max_attempts": 2, "interval_s": 0}},
        {"id": "keyed", "run": cell(), "effect": "write", "idempotency": {"strategy": "key"},
         "retry": {"max_attempts": 2, "interval_s": 0}},
        {"id": "blind", "run": cell(), "effect": "write", "idempotency": {"strategy": "none"}},
        {"id": "after", "run": cell(), "depends_on": ["blind"]},
    ))  # fmt: skip
    for step in ("read", "keyed", "blind"):
        plans.finish(run["id"], step, category=ErrorCategory.SANDBOX_ERROR)
    plans.executor.advance(run["id"])  # the retries are due at once (interval 0)

    state = plans.run(run["id"])["steps"]
    assert [len(state[s]["attempts"]) for s in ("read", "keyed", "blind")] == [2, 2, 1]
    assert state["blind"]["status"] == "unknown_outcome" and state["after"]["blocked_by"] == ["blind"]
    keyed = [plans.store.get(e) for e in state["keyed"]["attempts"]]
    assert {r.context["idempotency_key"] for r in keyed if r} == {f"{run['id']}:keyed"}, "one key for all attempts"
    plans.finish(run["id"], "read")
    plans.finish(run["id"], "keyed", category=ErrorCategory.SANDBOX_ERROR)  # attempts exhausted
    assert plans.statuses(run["id"])["keyed"] == "failed"

    settled = plans.http.post(
        f"/v1/runs/{run['id']}/steps/blind/reconcile",
        json={"outcome": "applied", "outputs": {"done": True}, "reason": "the downstream log shows it"},
        headers=plans.headers,
    )
    assert settled.status_code == 200 and settled.json()["steps"]["blind"]["status"] == "succeeded"
    assert settled.json()["steps"]["after"]["status"] == "running", "its dependant proceeds without a revision"
    again = plans.http.post(f"/v1/runs/{run['id']}/steps/blind/reconcile", json={
        "outcome": "applied", "reason": "twice"}, headers=plans.headers)  # fmt: skip
    assert again.status_code == 409


def test_an_approval_gates_its_step_and_a_rejection_feeds_the_replan(plans: Harness) -> None:
    gated = {"id": "pay", "run": cell(), "args": {"amount": {"$ref": "/inputs/amount"}},
             "approval": {"summary": "pay the invoice"}}  # fmt: skip
    run = plans.start(plan(gated, {"id": "note", "run": cell(), "depends_on": ["pay"]}, inputs={"amount": 12}))
    assert run["status"] == "awaiting_approval" and run["steps"]["pay"]["attempts"] == []
    (pending,) = plans.http.get("/v1/approvals?status=pending", headers=plans.headers).json()
    assert pending["args"] == {"amount": 12} and pending["summary"] == "pay the invoice"

    decided = plans.http.post(f"/v1/approvals/{pending['id']}/decision",
                              json={"decision": "reject", "reason": "too much"}, headers=plans.headers)  # fmt: skip
    conflicting = plans.http.post(f"/v1/approvals/{pending['id']}/decision",
                                  json={"decision": "approve"}, headers=plans.headers)  # fmt: skip

    assert decided.status_code == 200 and conflicting.status_code == 409
    final = plans.run(run["id"])
    assert final["status"] == "needs_replan" and final["steps"]["pay"]["error"]["category"] == "approval.rejected"
    assert final["steps"]["pay"]["attempts"] == [] and final["steps"]["note"]["status"] == "upstream_failed"

    second = plans.start(plan(gated, inputs={"amount": 5}))
    approval_id = second["steps"]["pay"]["approval_id"]
    plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"}, headers=plans.headers)
    assert plans.statuses(second["id"]) == {"pay": "running"}


def test_budgets_stop_runs_with_a_reason(plans: Harness) -> None:
    chain = plan({"id": "a", "run": cell(), "retry": {"max_attempts": 5, "interval_s": 0}}, budgets={"max_steps": 2})
    steps = plans.start(chain)
    plans.finish(steps["id"], "a", category=ErrorCategory.SANDBOX_ERROR)
    plans.executor.advance(steps["id"])
    plans.finish(steps["id"], "a", category=ErrorCategory.SANDBOX_ERROR)
    plans.executor.advance(steps["id"])
    assert (plans.run(steps["id"])["status"], plans.run(steps["id"])["stop_reason"]) == (
        "failed",
        "budget_exceeded:steps",
    )

    wall = plans.start(plan({"id": "a", "run": cell()}, budgets={"max_wall_s": 60}))
    aged = plans.executor.store.get(wall["id"])
    assert aged is not None and aged.steps["a"].status.value == "running"
    aged.created_at -= 120  # as if a minute had passed twice over
    plans.executor.store.put(aged, 0)
    plans.executor.advance(wall["id"])
    walled = plans.run(wall["id"])
    assert (walled["status"], walled["stop_reason"]) == ("failed", "budget_exceeded:wall")
    assert walled["steps"]["a"]["status"] == "cancelled"
    cancelled = plans.store.get(walled["steps"]["a"]["attempts"][0])
    assert cancelled is not None and cancelled.status is ExecutionStatus.CANCELLED, "its execution is cancelled too"

    replans = plans.start(plan({"id": "a", "run": cell()}, budgets={"max_replans": 0}))
    plans.finish(replans["id"], "a", category=ErrorCategory.CODE_EXCEPTION)
    refused = plans.http.post(
        f"/v1/runs/{replans['id']}/revisions",
        json={"base_revision": 1, "add": [{"id": "b", "run": cell()}]},
        headers=plans.headers,
    )
    assert refused.status_code == 409
    assert plans.run(replans["id"])["stop_reason"] == "replans_exhausted"


def test_runs_are_the_tenants_own(plans: Harness, api: Api) -> None:
    run = plans.start(plan({"id": "a", "run": cell()}))
    other = api[1]["beta"]
    assert plans.http.get(f"/v1/runs/{run['id']}", headers=other).status_code == 404
    assert plans.http.post(f"/v1/runs/{run['id']}/cancel", headers=other).status_code == 404
    assert plans.http.get("/v1/runs", headers=other).json() == []
    cancelled = plans.http.post(f"/v1/runs/{run['id']}/cancel", headers=plans.headers).json()
    assert cancelled["status"] == "cancelled" and cancelled["steps"]["a"]["status"] == "cancelled"


def test_reported_model_usage_counts_against_the_budget(plans: Harness) -> None:
    run = plans.start(plan({"id": "a", "run": cell()}, budgets={"max_tokens": 1000, "max_cost_usd": 5}))
    usage = {"model": "planner-v1", "role": "planner", "input_tokens": 600, "output_tokens": 100, "cost_usd": 0.5}

    first = plans.http.post(f"/v1/runs/{run['id']}/usage", json=usage, headers=plans.headers).json()
    second = plans.http.post(f"/v1/runs/{run['id']}/usage", json=usage, headers=plans.headers).json()

    assert first["status"] == "running" and first["usage"]["tokens"] == 700
    assert (second["status"], second["stop_reason"]) == ("failed", "budget_exceeded:tokens")
    assert second["usage"] == {**second["usage"], "tokens": 1400, "model_calls": 2, "cost_usd": 1.0}
    listed = plans.http.get("/v1/runs?status=failed", headers=plans.headers).json()
    assert [r["id"] for r in listed] == [run["id"]]
    assert plans.http.get("/v1/runs?status=running", headers=plans.headers).json() == []


def test_preconditions_run_before_the_step_and_one_that_fails_stops_it(plans: Harness) -> None:
    still_open = {
        "name": "still_open",
        "run": cell("import execbox\nexecbox.emit('status', 'open')"),
        "args": {"id": {"$ref": "/inputs/order"}},
        "expect": {"properties": {"status": {"const": "open"}}},
    }
    step = {"id": "close", "run": cell(), "effect": "write", "idempotency": {"strategy": "key"},
            "preconditions": [still_open]}  # fmt: skip
    run = plans.start(plan(step, inputs={"order": 7}))
    state = plans.run(run["id"])["steps"]["close"]
    assert (state["phase"], len(state["checks"]), state["attempts"]) == ("precondition:0", 1, [])
    check = plans.store.get(state["checks"][0])
    assert check is not None and check.inputs == {"id": 7} and check.origin == Origin(run=run["id"], step="close")

    plans.finish(run["id"], "close", {"status": "open"})
    assert len(plans.run(run["id"])["steps"]["close"]["attempts"]) == 1, "it held: the step itself runs"
    plans.finish(run["id"], "close", {"closed": True})
    assert plans.run(run["id"])["status"] == "succeeded"

    second = plans.start(plan(step, inputs={"order": 8}))
    plans.finish(second["id"], "close", {"status": "closed"})
    stopped = plans.run(second["id"])
    assert stopped["status"] == "needs_replan" and stopped["steps"]["close"]["attempts"] == []
    assert stopped["steps"]["close"]["error"]["category"] == "precondition.failed"
    assert stopped["steps"]["close"]["side_effects"] == "none"


def test_a_status_read_decides_whether_a_lost_write_is_retried(plans: Harness) -> None:
    status = {
        "name": "order_status",
        "run": cell("import execbox\nexecbox.emit('status', 'x')"),
        "expect": {"properties": {"status": {"const": "cancelled"}}, "required": ["status"]},
    }
    step = {"id": "cancel", "run": cell(), "effect": "write", "retry": {"max_attempts": 3, "interval_s": 0},
            "idempotency": {"strategy": "status_read", "status_check": status}}  # fmt: skip
    applied = plans.start(plan(step))
    plans.finish(applied["id"], "cancel", category=ErrorCategory.SANDBOX_ERROR)
    assert plans.run(applied["id"])["steps"]["cancel"]["phase"] == "status_read"
    plans.finish(applied["id"], "cancel", {"status": "cancelled"})
    done = plans.run(applied["id"])
    assert done["status"] == "succeeded" and len(done["steps"]["cancel"]["attempts"]) == 1, "not sent again"

    lost = plans.start(plan(step))
    plans.finish(lost["id"], "cancel", category=ErrorCategory.SANDBOX_ERROR)
    plans.finish(lost["id"], "cancel", {"status": "pending"})  # not applied: safe to send again
    plans.executor.advance(lost["id"])
    assert len(plans.run(lost["id"])["steps"]["cancel"]["attempts"]) == 2
    missing = plans.http.post("/v1/plans/validate", json=plan({**step, "idempotency": {"strategy": "status_read"}}),
                              headers=plans.headers)  # fmt: skip
    assert (
        missing.status_code == 422 and missing.json()["errors"][0]["field"] == "plan.steps.0.idempotency.status_check"
    )


def test_an_approval_may_name_the_keys_that_decide_it(plans: Harness, settings: Settings) -> None:
    approver_key, approver = ApiKeys(plans.client, settings.redis.key_prefix).create("alpha")
    gated = {"id": "pay", "run": cell(), "approval": {"summary": "pay", "by": [approver.key_id]}}
    run = plans.start(plan(gated))
    approval_id = run["steps"]["pay"]["approval_id"]

    refused = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"},
                              headers=plans.headers)  # fmt: skip
    decided = plans.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve",
                              "decided_by": "alice"}, headers={"Authorization": f"Bearer {approver_key}"})  # fmt: skip

    assert refused.status_code == 403 and refused.json()["code"] == "approval.forbidden"
    assert decided.status_code == 200 and decided.json()["decided_by"] == f"alice (key {approver.key_id})"
    assert plans.statuses(run["id"]) == {"pay": "running"}


def test_a_write_whose_execution_never_started_is_retried_even_without_a_key(plans: Harness) -> None:
    blind = {"id": "blind", "run": cell(), "effect": "write", "idempotency": {"strategy": "none"},
             "retry": {"max_attempts": 3, "interval_s": 0}}  # fmt: skip
    run = plans.start(plan(blind))

    plans.finish(run["id"], "blind", category=ErrorCategory.SANDBOX_ERROR, started=False)
    plans.executor.advance(run["id"])
    plans.finish(run["id"], "blind", category=ErrorCategory.SANDBOX_ERROR, started=True)

    state = plans.run(run["id"])["steps"]["blind"]
    assert len(state["attempts"]) == 2, "nothing could have happened before its code started: retried"
    assert state["status"] == "unknown_outcome", "once its code may have run: never retried blindly"


def test_postconditions_travel_with_the_steps_execution(plans: Harness) -> None:
    post = {"outputs_schema": {"required": ["rows"]}, "exit_code": 3}
    run = plans.start(plan({"id": "a", "run": cell(), "postconditions": post}))

    execution = plans.store.get(plans.executions_of(run["id"], "a")[0])

    assert execution is not None and execution.expect is not None
    assert (execution.expect.outputs_schema, execution.expect.exit_code) == ({"required": ["rows"]}, 3)


def test_parallel_steps_respect_max_parallel(plans: Harness) -> None:
    run = plans.start(plan(*({"id": f"s{i}", "run": cell()} for i in range(3)), budgets={"max_parallel": 2}))
    assert sorted(plans.statuses(run["id"]).values()) == ["pending", "running", "running"]
    first_running = next(s for s, status in plans.statuses(run["id"]).items() if status == "running")

    plans.finish(run["id"], first_running)

    assert sorted(plans.statuses(run["id"]).values()) == ["running", "running", "succeeded"]


def test_a_run_whose_goal_does_not_hold_hands_off_and_can_be_revised(plans: Harness) -> None:
    goal = {"step": "answer", "outputs_schema": {"properties": {"rows": {"minimum": 1}}, "required": ["rows"]}}
    run = plans.start(plan({"id": "answer", "run": cell()}, goal=goal))
    plans.finish(run["id"], "answer", {"rows": 0})

    stopped = plans.run(run["id"])
    assert (stopped["status"], stopped["stop_reason"]) == ("goal_failed", "goal_failed")
    handoff = plans.http.get(f"/v1/runs/{run['id']}/handoff", headers=plans.headers).json()
    assert handoff["status"] == "goal_failed" and [s["step_id"] for s in handoff["completed"]] == ["answer"]
    revised = plans.http.post(f"/v1/runs/{run['id']}/revisions", headers=plans.headers, json={
        "base_revision": 1, "add": [{"id": "answer2", "run": cell()}],
        "goal": {"step": "answer2", "outputs_schema": goal["outputs_schema"]}})  # fmt: skip
    assert revised.status_code == 200 and revised.json()["usage"]["replans"] == 1
    plans.finish(run["id"], "answer2", {"rows": 2})
    assert plans.run(run["id"])["status"] == "succeeded"


def test_an_event_for_a_run_whose_lock_is_held_is_not_missed_once_the_run_can_advance(
    settings: Settings, client: redis.Redis
) -> None:
    """A process that dies holding a run's lock must not make the run miss the event that came
    meanwhile: the run is made due again (uncounted: contention is no poison) and advanced from the
    due set once the lock lapses."""
    quick = settings.model_copy(update={"plans": settings.plans.model_copy(update={"claim_idle_s": 0.2})})
    keys = ApiKeys(client, settings.redis.key_prefix)
    headers = {"Authorization": f"Bearer {keys.create('alpha')[0]}"}
    http = InProcess(create_app(quick))
    try:
        harness = Harness((http, {"alpha": headers}), quick, client)
        run = harness.start(plan({"id": "a", "run": cell()}, {"id": "b", "run": cell(), "depends_on": ["a"]}))
        dead = client.lock(harness.keys.run_lock(run["id"]), timeout=30)  # a holder that will never release
        assert dead.acquire(blocking=False)
        execution_id = harness.executions_of(run["id"], "a")[0]
        store = harness.store
        store.transition(execution_id, {ExecutionStatus.QUEUED}, "t", lambda r: ExecutionStatus.RUNNING)
        store.transition(execution_id, {ExecutionStatus.RUNNING}, "t", lambda r: ExecutionStatus.SUCCEEDED)
        group = f"plans.{quick.queue.name}"

        def handled_and_due() -> bool:
            pending: Any = client.xpending(harness.keys.events, group)
            due = client.zscore(harness.keys.active_runs, run["id"])
            return pending["pending"] == 0 and due is not None and due <= time.time()

        # The consumer waits for the lock (LOCK_WAIT_S), gives up, and makes the run due now.
        wait_until(handled_and_due, 30, "the event handled and the run due again")
        assert harness.statuses(run["id"])["b"] == "pending"
        assert not client.xlen(harness.keys.dead_letters("plans")), "contention set nothing aside"
        dead.release()  # as if its lease had lapsed

        wait_until(lambda: harness.statuses(run["id"])["b"] == "running", 30, "the run to advance after all")
    finally:
        http.close()
