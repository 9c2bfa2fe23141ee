"""The rules of declared side effects, as pure logic: what an unknown outcome calls for, what a
status check's answer does, decisions and reconciles on the record, and plan steps' key templates."""

from __future__ import annotations

import time
from typing import Literal

import pytest
from redis import Redis

from execbox.core.errors import InvalidRequest
from execbox.executions.effects import MAX_ATTEMPTS, EffectIdempotency, Next, StatusCheck, call_context, next_step
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError
from execbox.executions.settle import after_run, approval_decided, mark_expired_if_due, reconciled, settle_uncertain
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.plans.step_keys import KeyProblem, collisions, digest, render, template_problem
from execbox.settings import Settings
from tests.unit.conftest import make_record

LOST = ExecutionError(category=ErrorCategory.SANDBOX_ERROR, message="worker lost", retryable=True)
CHECK = StatusCheck(code="1", expect={"properties": {"applied": {"const": True}}})


@pytest.mark.parametrize(
    ("effect", "strategy", "runs", "in_session", "expected"),
    [
        (None, None, 1, False, Next.FAIL),
        ("read", None, 1, False, Next.RETRY),
        ("read", None, MAX_ATTEMPTS, False, Next.FAIL),
        ("write", "key", 1, False, Next.RETRY),
        ("write", "key", MAX_ATTEMPTS, False, Next.FAIL),
        ("write", "key", 1, True, Next.FAIL),
        ("write", "status_read", 1, False, Next.STATUS_READ),
        ("write", "status_read", MAX_ATTEMPTS, False, Next.STATUS_READ),
        ("write", "none", 1, False, Next.UNKNOWN),
        ("write", "none", 1, True, Next.UNKNOWN),
    ],
)
def test_what_an_unknown_outcome_calls_for(
    effect: str | None, strategy: str | None, runs: int, in_session: bool, expected: Next
) -> None:
    assert next_step(effect, strategy, runs, in_session) is expected


def declared(
    settings: Settings, strategy: Literal["key", "status_read", "none"] | None,
    effect: Literal["read", "write"] | None = "write", runs: int = 1,
) -> ExecutionRecord:  # fmt: skip
    record = make_record(settings)
    record.status, record.code_runs, record.attempt, record.effect = ExecutionStatus.RUNNING, runs, runs, effect
    if strategy is not None:
        check = CHECK if strategy == "status_read" else None
        record.idempotency = EffectIdempotency(strategy=strategy, status_check=check)
    record.error = LOST
    return record


def test_a_lost_keyed_write_is_queued_again_with_a_new_deadline(settings: Settings) -> None:
    record = declared(settings, "key")
    record.queue_deadline = 0.0
    assert settle_uncertain(record) is ExecutionStatus.QUEUED
    assert record.queue_deadline > time.time() and record.phase is None


def test_a_lost_status_read_write_is_queued_for_its_check(settings: Settings) -> None:
    record = declared(settings, "status_read")
    assert settle_uncertain(record) is ExecutionStatus.QUEUED and record.phase == "status_read"


def test_a_lost_unkeyed_write_ends_unknown_and_not_retryable(settings: Settings) -> None:
    record = declared(settings, "none")
    assert settle_uncertain(record) is ExecutionStatus.UNKNOWN_OUTCOME
    assert record.side_effects == "unknown" and record.error is not None and not record.error.retryable


def test_checks_whose_workers_keep_dying_end_unknown(settings: Settings) -> None:
    record = declared(settings, "status_read")
    record.attempt = 2 * MAX_ATTEMPTS
    assert settle_uncertain(record) is ExecutionStatus.UNKNOWN_OUTCOME


def test_an_undeclared_lost_execution_fails_as_before(settings: Settings) -> None:
    record = declared(settings, None, effect=None)
    assert settle_uncertain(record) is ExecutionStatus.FAILED and record.side_effects is None


def check_ran(status: ExecutionStatus, outputs: dict[str, object]):  # type: ignore[no-untyped-def]
    def apply(record: ExecutionRecord) -> ExecutionStatus:
        record.outputs, record.error = outputs, None
        return status

    return apply


@pytest.mark.parametrize(
    ("status", "outputs", "runs", "expected", "side_effects"),
    [
        (ExecutionStatus.SUCCEEDED, {"applied": True}, 1, ExecutionStatus.SUCCEEDED, None),
        (ExecutionStatus.SUCCEEDED, {"applied": False}, 1, ExecutionStatus.QUEUED, None),
        (ExecutionStatus.SUCCEEDED, {"applied": False}, MAX_ATTEMPTS, ExecutionStatus.FAILED, "none"),
        (ExecutionStatus.FAILED, {}, 1, ExecutionStatus.UNKNOWN_OUTCOME, "unknown"),
    ],
    ids=["applied", "not-applied", "not-applied-no-attempt-left", "cannot-tell"],
)
def test_what_a_status_check_says_decides_the_execution(
    settings: Settings,
    status: ExecutionStatus,
    outputs: dict[str, object],
    runs: int,
    expected: ExecutionStatus,
    side_effects: str | None,
) -> None:
    record = declared(settings, "status_read", runs=runs)
    record.phase = "status_read"
    assert after_run(check_ran(status, outputs), CHECK, record) is expected
    assert record.side_effects == side_effects and record.phase is None
    if expected is ExecutionStatus.SUCCEEDED:
        assert record.outputs == {"applied": True} and record.reconciled
    if expected is ExecutionStatus.QUEUED:
        assert record.outputs == {}, "the check's outputs are not the code's"


def test_a_code_run_that_says_unknown_follows_the_declaration(settings: Settings) -> None:
    unsure = ExecutionError(category=ErrorCategory.OUTCOME_UNKNOWN, message="timed out", retryable=False)

    def ran(record: ExecutionRecord) -> ExecutionStatus:
        record.error = unsure
        return ExecutionStatus.FAILED

    assert after_run(ran, None, declared(settings, "key")) is ExecutionStatus.QUEUED
    assert after_run(ran, None, declared(settings, "none")) is ExecutionStatus.UNKNOWN_OUTCOME

    def raised(record: ExecutionRecord) -> ExecutionStatus:
        record.error = ExecutionError(category=ErrorCategory.CODE_EXCEPTION, message="x", retryable=False)
        return ExecutionStatus.FAILED

    failed = declared(settings, "key")
    assert after_run(raised, None, failed) is ExecutionStatus.FAILED and failed.side_effects == "possible"


def test_decisions_and_reconciles_change_the_record_as_said(settings: Settings) -> None:
    waiting = make_record(settings)
    waiting.status, waiting.effect = ExecutionStatus.AWAITING_APPROVAL, "write"
    assert approval_decided("alpha", True, "")(waiting) is ExecutionStatus.QUEUED
    assert approval_decided("beta", True, "")(waiting) is None, "another tenant's decision moves nothing"
    rejected = approval_decided("alpha", False, "no")(waiting)
    assert rejected is ExecutionStatus.FAILED and waiting.error and waiting.error.category == "approval.rejected"
    waiting.queue_deadline = 0.0
    assert approval_decided("alpha", True, "")(waiting) is ExecutionStatus.EXPIRED
    assert waiting.error and waiting.error.category == "approval.expired"
    unknown = declared(settings, "none")
    assert reconciled(True, {"applied": True}, "seen")(unknown) is ExecutionStatus.SUCCEEDED
    assert unknown.outputs == {"applied": True} and unknown.reconciled == "applied: seen" and unknown.error is None


def test_the_call_key_is_the_declared_one_else_the_request_s() -> None:
    keyed = EffectIdempotency(strategy="key", key="k-1")
    assert call_context(keyed, None, "header")["idempotency_key"] == "k-1"
    assert call_context(None, None, "header")["idempotency_key"] == "header"
    assert call_context(None, {"idempotency_key": "run:step"}, "header")["idempotency_key"] == "run:step"
    assert "idempotency_key" not in call_context(None, None, None)
    with pytest.raises(InvalidRequest):
        call_context(EffectIdempotency(strategy="key"), None, None)


def test_key_templates_render_from_the_arguments_and_refuse_what_they_cannot() -> None:
    assert template_problem("refund:{args.order}", {"order": "o"}) is None
    assert "no argument" in (template_problem("refund:{args.customer}", {"order": "o"}) or "")
    assert "placeholder" in (template_problem("refund:{order}", {"order": "o"}) or "")
    assert "names at least one" in (template_problem("refund", {}) or "")
    assert render("refund:{args.order}:{args.n}", {"order": "o-1", "n": 3}) == "refund:o-1:3"
    assert render("r:{args.o.id}", {"o": {"id": "x"}}) == "r:x"
    with pytest.raises(KeyProblem):
        render("r:{args.o.id}", {"o": "x"})
    with pytest.raises(KeyProblem):
        render("r:{args.o}", {"o": "a\nb"})


def test_a_key_used_with_other_arguments_collides() -> None:
    used = {"refund:o-1": digest({"order": "o-1"})}
    same = ("f0", "refund:{args.order}", {"order": "o-1"})
    other = ("f1", "refund:{args.order}", {"order": "o-1", "amount": 5})
    referring = ("f2", "refund:{args.order}", {"order": {"$ref": "/inputs/order"}})
    assert collisions([same, referring], used) == []
    assert [p.field for p in collisions([same, other], used)] == ["f1"]
    assert [p.field for p in collisions([other, same], {})] == ["f0"], "two new steps collide too"


def test_an_expired_requeue_of_a_write_that_ran_says_its_effect_may_have_happened(settings: Settings) -> None:
    keyed, unkeyed = declared(settings, "key"), declared(settings, "none")
    for record in (keyed, unkeyed):
        record.status, record.queue_deadline = ExecutionStatus.QUEUED, 0.0
    assert mark_expired_if_due(keyed) is ExecutionStatus.FAILED and keyed.side_effects == "possible"
    assert keyed.error is not None and keyed.error.retryable and "same key" in keyed.error.message
    assert mark_expired_if_due(unkeyed) is ExecutionStatus.UNKNOWN_OUTCOME and unkeyed.side_effects == "unknown"


def test_a_status_check_whose_schema_cannot_judge_ends_unknown(settings: Settings) -> None:
    record = declared(settings, "status_read")
    broken = StatusCheck(code="1", expect={"type": 5})
    assert after_run(check_ran(ExecutionStatus.SUCCEEDED, {"applied": True}), broken, record) is (
        ExecutionStatus.UNKNOWN_OUTCOME
    )


def test_a_lease_is_renewed_only_by_its_holder_or_taken_when_it_lapsed(settings: Settings, client: Redis) -> None:
    store = ExecutionStore(client, settings)
    store.renew_lease("exe_" + "a" * 26, "worker-b")
    store.renew_lease("exe_" + "a" * 26, "worker-a")  # a worker declared lost, renewing late
    assert store.lease_holder("exe_" + "a" * 26) == "worker-b"
    client.delete(store.keys.lease("exe_" + "a" * 26))
    store.renew_lease("exe_" + "a" * 26, "worker-a")  # its own lease lapsed while Redis was away
    assert store.lease_holder("exe_" + "a" * 26) == "worker-a"


def test_a_rendered_key_is_printable_ascii() -> None:
    with pytest.raises(KeyProblem):
        render("r:{args.o}", {"o": "café"})
    with pytest.raises(KeyProblem):
        render("r:{args.o}", {"o": "\x85"})
