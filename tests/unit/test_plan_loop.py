"""Plans that hold the whole loop, in-process against a real Redis: what input steps and fallbacks
may declare (refused up front, each with its path), the fallback's rules beside retries and
unknown outcomes, and model calls kept whole (pure logic of execbox.plans.usage). The loop run
through the API and the worker's real code is in test_plan_loop_in_process.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.plans import store as store_module
from execbox.plans import usage
from execbox.plans.consumer import PlanConsumer
from execbox.plans.errors import RunBusy
from execbox.plans.usage import ModelCall, ModelCallReport, Usage
from tests.conftest import wait_until
from tests.unit.test_plans import Harness, cell, plan
from tests.unit.test_plans import plans as plans  # the fixture

pytestmark = pytest.mark.redis
SQL = {"type": "object", "required": ["sql"], "properties": {"sql": {"type": "string"}}}


def problems(plans: Harness, document: dict[str, Any]) -> dict[str, str]:
    answer = plans.http.post("/v1/plans/validate", json=document, headers=plans.headers)
    assert answer.status_code == 422, answer.text
    return {e["field"]: e["message"] for e in answer.json()["errors"]}


def test_an_input_step_takes_only_its_own_fields_and_a_schema_that_compiles(plans: Harness) -> None:
    shape = problems(plans, plan({"id": "q", "input": {"schema": SQL}, "run": cell()}, {"id": "u"}))
    found = problems(plans, plan(
        {"id": "a", "run": cell()},
        {"id": "r", "input": {"schema": SQL}, "effect": "write", "retry": {}, "policy": {"name": "large"}},
        {"id": "s", "input": {"schema": {"type": "nonsense"}}},
        {"id": "t", "input": {"schema": SQL}, "args": {"f": {"$artifact": "/steps/a/artifacts/x.csv"}}},
    ))  # fmt: skip

    assert set(shape) == {"steps.0", "steps.1"} and all("either `run`" in m for m in shape.values())
    assert {f for f, m in found.items() if "takes only" in m} == {
        "plan.steps.1.effect", "plan.steps.1.retry", "plan.steps.1.policy"
    }  # fmt: skip
    assert "plan.steps.2.input.schema" in found
    assert "not to files" in found["plan.steps.3.args.f"]


def test_an_input_step_counts_against_no_step_budget(plans: Harness) -> None:
    document = plan({"id": "a", "run": cell()}, {"id": "q", "input": {"schema": SQL}, "depends_on": ["a"]},
                    budgets={"max_steps": 1})  # fmt: skip
    answer = plans.http.post("/v1/plans/validate", json=document, headers=plans.headers)
    assert answer.status_code == 200, answer.text


def test_a_fallback_is_checked_like_the_step_it_stands_in_for(plans: Harness) -> None:
    shape = problems(plans, plan(
        {"id": "b", "run": cell(), "fallback": {"on": [], "run": cell()}},
        {"id": "c", "run": cell(), "fallback": {"on": ["cancelled"], "run": cell()}},
    ))  # fmt: skip
    found = problems(plans, plan(
        {"id": "a", "run": cell(), "fallback": {"on": ["check.failed"], "run": cell("  \n")}},
        {"id": "d", "run": cell(), "fallback": {"on": ["check.failed"], "run": cell(),
                                                "policy": {"memory_mb": 1 << 19}}},
        {"id": "e", "run": cell(), "fallback": {"on": ["check.failed"], "run": cell(),
                                                "args": {"x": {"$ref": "/steps/nope/outputs/y"}}}},
        {"id": "f", "run": cell(), "fallback": {"on": ["check.failed"], "run": {"script": "none.such@proven"}}},
    ))  # fmt: skip

    assert set(shape) == {"steps.0.fallback.on", "steps.1.fallback.on.0"}, "a cancellation is no failure it answers"
    assert "blank" in found["plan.steps.0.fallback.run.code"]
    assert any(f.startswith("plan.steps.1.") and "memory_mb" in f for f in found), found
    assert "no step 'nope'" in found["plan.steps.2.fallback.args.x"]
    assert "plan.steps.3.fallback.run.script" in found


def test_a_fallback_runs_once_its_steps_retries_are_spent_and_gets_its_own(plans: Harness) -> None:
    backup = {"name": "backup", "on": ["sandbox.error"], "run": cell("print('backup')")}
    run = plans.start(plan({"id": "a", "run": cell(), "retry": {"interval_s": 0}, "fallback": backup},
                           {"id": "b", "run": cell(), "args": {"v": {"$ref": "/steps/a/outputs/v"}}}))  # fmt: skip
    for _ in range(3):
        plans.finish(run["id"], "a", category=ErrorCategory.SANDBOX_ERROR)
    state = plans.run(run["id"])["steps"]["a"]
    assert len(state["attempts"]) == 4 and state["fallback_at"] == 4 and state["status"] == "running"
    assert state["fallback_from"]["category"] == "sandbox.error"
    fallback = plans.store.get(state["attempts"][-1])
    assert fallback is not None and fallback.code == "print('backup')"

    plans.finish(run["id"], "a", category=ErrorCategory.SANDBOX_ERROR)
    assert len(plans.run(run["id"])["steps"]["a"]["attempts"]) == 5, "its own retries, counted afresh"
    plans.finish(run["id"], "a", {"v": 7})
    done = plans.run(run["id"])
    assert done["steps"]["a"]["outputs"] == {"v": 7} and done["steps"]["b"]["status"] == "running"
    second = plans.store.get(done["steps"]["b"]["attempts"][0])
    assert second is not None and second.inputs == {"v": 7}, "dependents read the fallback's outputs as the step's"


def test_no_fallback_after_an_unknown_outcome_or_a_category_it_does_not_name(plans: Harness) -> None:
    backup = {"on": ["sandbox.error", "check.failed"], "run": cell("print('backup')")}
    run = plans.start(plan(
        {"id": "w", "run": cell(), "effect": "write", "idempotency": {"strategy": "none"}, "fallback": backup},
        {"id": "r", "run": cell(), "fallback": backup},
    ))  # fmt: skip
    plans.finish(run["id"], "w", category=ErrorCategory.SANDBOX_ERROR)
    plans.finish(run["id"], "r", category=ErrorCategory.CODE_EXCEPTION)

    after = plans.run(run["id"])
    assert after["steps"]["w"]["status"] == "unknown_outcome" and after["steps"]["w"]["fallback_from"] is None
    assert after["steps"]["r"]["status"] == "failed" and len(after["steps"]["r"]["attempts"]) == 1
    assert after["status"] == "needs_replan"


def report(**fields: Any) -> ModelCallReport:
    return ModelCallReport.model_validate(fields)


def test_model_calls_are_summed_per_role_and_a_call_id_counts_once() -> None:
    total, calls, recent = Usage(), list[ModelCall](), list[str]()
    assert usage.record(total, calls, recent, report(role="planner", input_tokens=10, output_tokens=5, cost_usd=0.5,
                                             latency_ms=100, call_id="x"), 1.0)  # fmt: skip
    assert not usage.record(total, calls, recent, report(role="planner", input_tokens=99, call_id="x"), 2.0)
    assert usage.record(total, calls, recent, report(role="joiner", output_tokens=7), 3.0)
    assert usage.record(total, calls, recent, report(role="joiner", output_tokens=1), 4.0), (
        "no call_id: every report counts"
    )

    assert (total.tokens, total.input_tokens, total.output_tokens, total.model_calls) == (23, 10, 13, 3)
    assert total.by_role["planner"].model_dump() == {"calls": 1, "input_tokens": 10, "output_tokens": 5,
                                                     "cost_usd": 0.5, "latency_ms": 100.0}  # fmt: skip
    assert total.by_role["joiner"].calls == 2 and total.by_role["joiner"].output_tokens == 8
    assert [c.at for c in calls] == [1.0, 3.0, 4.0]


def test_calls_past_the_listed_thousand_still_count() -> None:
    total, calls, recent = Usage(), list[ModelCall](), list[str]()
    for i in range(usage.MAX_LISTED_CALLS + 5):
        usage.record(total, calls, recent, report(input_tokens=1, call_id=f"c{i}"), float(i))
    assert len(calls) == usage.MAX_LISTED_CALLS and total.unlisted_calls == 5
    assert total.model_calls == usage.MAX_LISTED_CALLS + 5 and total.tokens == usage.MAX_LISTED_CALLS + 5


def test_budgets_name_what_was_passed() -> None:
    assert usage.over_budget(Usage(tokens=11, cost_usd=0.1), 10, None) == "tokens"
    assert usage.over_budget(Usage(tokens=5, cost_usd=2.0), 10, 1.0) == "cost"
    assert usage.over_budget(Usage(tokens=10, cost_usd=1.0), 10, 1.0) is None, "reaching a budget is not passing it"


@pytest.mark.parametrize("role", ["a b", "x" * 65, "-lead", "plan!"])
def test_a_role_is_a_short_word(role: str) -> None:
    with pytest.raises(ValueError, match="role"):
        report(role=role)


def test_a_role_is_read_in_lower_case_and_an_empty_one_is_the_agent() -> None:
    assert (report(role="Planner").role, report(role="").role, report().role) == ("planner", "agent", "agent")


def test_a_cost_budget_stops_a_run_with_its_reason_and_the_hand_off_shows_the_sums(plans: Harness) -> None:
    run = plans.start(plan({"id": "a", "run": cell()}, budgets={"max_cost_usd": 0.05}))
    call = {"model": "m", "role": "replanner", "input_tokens": 10, "output_tokens": 2}
    within = plans.http.post(f"/v1/runs/{run['id']}/usage", json={**call, "cost_usd": 0.05}, headers=plans.headers)
    assert within.json()["status"] == "running", "reaching the budget is not passing it"
    over = plans.http.post(f"/v1/runs/{run['id']}/usage", json={**call, "cost_usd": 0.01}, headers=plans.headers)

    body = over.json()
    assert body["status"] == "failed" and body["stop_reason"] == "budget_exceeded:cost"
    assert body["steps"]["a"]["status"] == "cancelled"
    assert body["usage"]["by_role"]["replanner"]["calls"] == 2
    late = plans.http.post(f"/v1/runs/{run['id']}/usage", json=call, headers=plans.headers).json()
    assert late["status"] == "failed" and late["usage"]["model_calls"] == 3, "a stopped run still counts its calls"


def test_the_hand_off_carries_the_usage_per_role(plans: Harness) -> None:
    run = plans.start(plan({"id": "a", "run": cell()}))
    call = {"role": "planner", "input_tokens": 100, "output_tokens": 40}
    plans.http.post(f"/v1/runs/{run['id']}/usage", json=call, headers=plans.headers)
    plans.finish(run["id"], "a", category=ErrorCategory.CODE_EXCEPTION)

    handoff = plans.http.get(f"/v1/runs/{run['id']}/handoff", headers=plans.headers).json()
    assert handoff["usage"]["by_role"]["planner"]["input_tokens"] == 100 and handoff["usage"]["tokens"] == 140


def approve(plans: Harness, run_id: str) -> dict[str, Any]:
    pending = plans.http.get("/v1/approvals?status=pending", headers=plans.headers).json()
    (mine,) = [a for a in pending if a["run_id"] == run_id]
    decided = plans.http.post(f"/v1/approvals/{mine['id']}/decision", json={"decision": "approve"},
                              headers=plans.headers)  # fmt: skip
    assert decided.status_code == 200, decided.text
    plans.executor.advance(run_id)
    return dict(mine)


def test_a_gated_steps_fallback_asks_its_approval_again_showing_its_own_code(plans: Harness) -> None:
    backup = {
        "name": "manual mail",
        "on": ["code.exception", "code.exit_nonzero"],
        "run": cell("print('the backup mailer')"),
    }
    gated = {"id": "send", "run": cell("print('the mailer')"), "approval": {"summary": "mail the report"},
             "fallback": backup}  # fmt: skip
    run = plans.start(plan(gated))
    first = approve(plans, run["id"])
    plans.finish(run["id"], "send", category=ErrorCategory.CODE_EXCEPTION)

    again = plans.run(run["id"])
    assert again["status"] == "awaiting_approval" and again["steps"]["send"]["status"] == "awaiting_approval"
    assert len(again["steps"]["send"]["attempts"]) == 1, "the fallback waits for its own decision"
    second = approve(plans, run["id"])
    assert first["code"] == "print('the mailer')" and second["code"] == "print('the backup mailer')"
    assert "manual mail" in second["summary"]
    assert plans.run(run["id"])["steps"]["send"]["status"] == "running"


def test_a_gated_script_step_asks_its_approval(plans: Harness) -> None:
    script = {"name": "reports.gated", "version": "1.0.0", "language": "python",
              "code": "import execbox\nexecbox.emit('n', 1)\n", "input_schema": {"type": "object"}}  # fmt: skip
    assert plans.http.post("/v1/scripts", json=script, headers=plans.headers).status_code == 201
    run = plans.start(plan({"id": "s", "run": {"script": "reports.gated@1.0.0"}, "approval": {"summary": "go"}}))

    assert run["status"] == "awaiting_approval", run["events"]
    asked = approve(plans, run["id"])
    assert "reports.gated@1.0.0" in asked["code"]
    assert plans.run(run["id"])["steps"]["s"]["status"] == "running"


def test_a_value_too_deep_or_too_large_is_refused_and_dispatches_nothing(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": {"type": "object"}}},
                           {"id": "b", "run": cell(), "args": {"v": {"$ref": "/steps/q/outputs/v"}}}))  # fmt: skip
    deep: Any = 1
    for _ in range(250):
        deep = [deep]
    url = f"/v1/runs/{run['id']}/steps/q/input"
    refused = [plans.http.post(url, json={"value": v}, headers=plans.headers)
               for v in ({"v": deep}, {"v": "x" * (64 * 1024)})]  # fmt: skip
    assert [r.status_code for r in refused] == [422, 422]
    assert all(r.json()["errors"][0]["field"] == "value" for r in refused), [r.json() for r in refused]
    assert plans.run(run["id"])["steps"]["b"]["attempts"] == [], "nothing was dispatched on a refused value"

    plans.http.post(url, json={"value": {"v": 1}}, headers=plans.headers)
    (attempt,) = plans.executions_of(run["id"], "b")
    record = plans.store.get(attempt)
    assert record is not None and record.inputs == {"v": 1}


def test_the_same_value_means_the_same_json(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": {"type": "object"}}}))
    url = f"/v1/runs/{run['id']}/steps/q/input"
    assert plans.http.post(url, json={"value": {"ok": True}}, headers=plans.headers).status_code == 200
    again = plans.http.post(url, json={"value": {"ok": True}}, headers=plans.headers)
    other = [plans.http.post(url, json={"value": {"ok": v}}, headers=plans.headers).status_code for v in (1, 1.0)]
    assert again.status_code == 200 and other == [409, 409], "1 and 1.0 are not true"


def test_a_key_that_may_not_supply_an_input_may_not_remove_it_either(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": {"type": "object"}, "by": ["key_someone_else"]}},
                           {"id": "use", "run": cell(), "args": {"v": {"$ref": "/steps/q/outputs/v"}}}))  # fmt: skip
    revision = {"base_revision": 1, "reason": "mine instead", "remove": ["q", "use"],
                "add": [{"id": "use2", "run": cell(), "args": {"v": "my value"}}]}  # fmt: skip
    refused = plans.http.post(f"/v1/runs/{run['id']}/revisions", json=revision, headers=plans.headers)

    assert refused.status_code == 403 and refused.json()["code"] == "input.forbidden"
    assert refused.json()["errors"][0]["field"] == "remove.0"
    assert plans.statuses(run["id"]) == {"q": "awaiting_input", "use": "pending"}


def test_no_fallback_once_an_earlier_attempt_of_a_write_may_have_applied(plans: Harness) -> None:
    gate = {"name": "open", "run": cell(), "expect": {"required": ["open"], "properties": {"open": {"const": True}}}}
    write = {
        "id": "w",
        "run": cell(),
        "effect": "write",
        "idempotency": {"strategy": "key"},
        "preconditions": [gate],
        "retry": {"interval_s": 0},
        "fallback": {"on": ["precondition.failed", "expired"], "run": cell()},
    }
    run = plans.start(plan(write))
    plans.finish(run["id"], "w", {"open": True})  # the precondition holds
    plans.finish(run["id"], "w", category=ErrorCategory.SANDBOX_ERROR)  # its code started, then the worker died
    plans.finish(run["id"], "w", {"open": False})  # before the retry the precondition no longer holds

    state = plans.run(run["id"])["steps"]["w"]
    assert state["status"] == "failed" and state["error"]["category"] == "precondition.failed"
    assert state["fallback_from"] is None and len(state["attempts"]) == 1, "the fallback did not run"
    assert state["side_effects"] == "possible" and state["may_have_applied"]


def test_a_fallback_and_a_compensation_do_not_go_together(plans: Harness) -> None:
    found = problems(
        plans,
        plan(
            {
                "id": "w",
                "run": cell(),
                "effect": "write",
                "idempotency": {"strategy": "key"},
                "compensation": {"run": cell()},
                "fallback": {"on": ["check.failed"], "run": cell()},
            }
        ),
    )
    assert "takes no fallback" in found["plan.steps.0.fallback"]


def test_a_run_counts_at_most_32_roles() -> None:
    total, calls, recent = Usage(), list[ModelCall](), list[str]()
    for i in range(usage.MAX_ROLES):
        usage.record(total, calls, recent, report(role=f"r{i}"), 0.0)
    assert usage.role_problem(total, "r0") is None and usage.role_problem(total, "another")


def test_a_retried_report_past_the_listed_thousand_counts_once() -> None:
    total, calls, recent = Usage(), list[ModelCall](), list[str]()
    for i in range(usage.MAX_LISTED_CALLS):
        usage.record(total, calls, recent, report(call_id=f"c{i}"), 0.0)
    counted = [usage.record(total, calls, recent, report(input_tokens=100, call_id="retry-me"), 1.0) for _ in range(3)]
    assert counted == [True, False, False] and total.input_tokens == 100 and len(recent) == usage.RECENT_IDS


def test_what_a_step_stores_reads_back_in_the_previous_version_and_answers_schema() -> None:
    from execbox.plans.schemas import InputWait, StepSpec

    plain = StepSpec.model_validate({"id": "a", "run": cell()}).model_dump(mode="json")
    assert "input" not in plain and "fallback" not in plain, "unset new fields are not stored"
    asked = StepSpec.model_validate({"id": "q", "input": {"schema": SQL}}).model_dump(mode="json")
    wait = InputWait(value_schema=SQL, expires_at=1.0).model_dump(mode="json")
    assert asked["input"]["schema"] == SQL and wait["schema"] == SQL, "the wire name everywhere, webhooks included"
    assert InputWait.model_validate(wait).value_schema == SQL


def test_a_holder_whose_lock_lapsed_stores_nothing(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": {"type": "object"}}}))
    store = plans.executor.store
    with store.locked(run["id"]):
        stale = store.get(run["id"])
        assert stale is not None
        plans.client.delete(plans.keys.run_lock(run["id"]))  # the lease lapsed while it stalled

        def later_holder() -> None:  # another request takes the lock and changes the run
            with store.locked(run["id"]):
                fresh = store.get(run["id"])
                assert fresh is not None
                fresh.labels = {"changed": "by the later holder"}
                store.put(fresh, None)

        other = threading.Thread(target=later_holder)
        other.start()
        other.join()
        stale.labels = {"changed": "by the stalled holder"}
        with pytest.raises(RunBusy):
            store.put(stale, None)
    assert plans.run(run["id"])["labels"] == {"changed": "by the later holder"}, "the later change was not lost"


def test_a_script_steps_postconditions_hold_beside_the_scripts_own_output_schema(plans: Harness) -> None:
    counted = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    script = {"name": "reports.counted", "version": "1.0.0", "language": "python", "output_schema": counted,
              "code": "import execbox\nexecbox.emit('n', 1)\n", "input_schema": {"type": "object"}}  # fmt: skip
    assert plans.http.post("/v1/scripts", json=script, headers=plans.headers).status_code == 201
    post = {"outputs_schema": {"properties": {"n": {"minimum": 5}}}}
    run = plans.start(plan({"id": "s", "run": {"script": "reports.counted@1.0.0"}, "postconditions": post}))

    record = plans.store.get(plans.executions_of(run["id"], "s")[0])
    assert record is not None and record.expect is not None
    assert record.expect.outputs_schema == {"allOf": [counted, post["outputs_schema"]]}
    plans.finish(run["id"], "s", {"n": 1})
    state = plans.run(run["id"])["steps"]["s"]
    assert state["status"] == "failed" and state["error"]["category"] == "output.invalid", state


def test_another_deployments_run_is_neither_locked_nor_ended_from_here(plans: Harness) -> None:
    run = plans.start(plan({"id": "q", "input": {"schema": {"type": "object"}}}))
    store = plans.executor.store
    stored = store.get(run["id"])
    assert stored is not None
    stored.queue = "another-deployment"
    store.put(stored, time.time())
    plans.client.set(plans.keys.run_lock(run["id"]), b"its owner's token", px=60_000)  # its owner is changing it

    started = time.monotonic()
    seen = plans.executor.advance(run["id"])
    ended = plans.executor.abandon(run["id"], "set aside after its last attempt: (test)")
    assert time.monotonic() - started < 1.0, "no lock was waited for"
    assert seen is not None and ended is not None and ended.status.value == "awaiting_input"
    assert plans.run(run["id"])["status"] == "awaiting_input", "another deployment's run is never ended from here"


def test_a_run_another_holder_is_changing_is_looked_at_again_and_never_set_aside(
    plans: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = plans.start(plan({"id": "a", "run": cell()}, {"id": "b", "run": cell(), "depends_on": ["a"]}))
    # The app's own plan loop may hold the run while it is created; the first step is submitted
    # by one of them before the lock is taken from both.
    wait_until(lambda: plans.executions_of(run["id"], "a"), 5, "the first step to be submitted")
    monkeypatch.setattr(store_module, "LOCK_WAIT_S", 0.05)
    consumer = PlanConsumer(plans.executor, "test", idle_s=1.0)
    lock = plans.keys.run_lock(run["id"])
    plans.client.set(lock, b"another holder", px=60_000)
    (first,) = plans.executions_of(run["id"], "a")
    plans.store.transition(first, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)
    plans.store.transition(first, {ExecutionStatus.RUNNING}, "test", lambda r: ExecutionStatus.SUCCEEDED)
    for _ in range(8):  # more than the guard's attempts: contention is no poison
        consumer.handle({"type": "execution.terminal", "id": first})
        consumer.advance_due()
    assert plans.client.zscore(plans.keys.active_runs, run["id"]) is not None, "still due, never set aside"
    assert plans.run(run["id"])["status"] == "running" and plans.statuses(run["id"])["a"] == "running"

    plans.client.delete(lock)
    # The API's own plan loop runs beside this consumer and may be the one that advances it (this
    # consumer then finds the run busy), so the run is read until one of them has.
    expected = {"a": "succeeded", "b": "running"}

    def advanced() -> bool:
        consumer.advance_due()
        return plans.statuses(run["id"]) == expected

    wait_until(advanced, 5, "the run to advance once the holder let go")
