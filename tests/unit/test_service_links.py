"""Service links and shared scripts, from the attacker's side (issue #28, findings 1, 6, 8, 9, 10):
labels beginning `execbox.` are refused on every request, the service's own links ride in an
execution's `origin` (which no request can set) and are checked against the tenant before they are
followed, a tenant never changes the operator's shared script, and a label is no evidence.

Records "stored before the fix" are written straight into Redis with the label links an attacker
could set then; the consumers (the app's own threads) must neither die of them nor follow them."""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
import redis
from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError

import execbox
from execbox.api import create_app
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionError
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.keyschema import Keys
from execbox.schedules.scheduler import Scheduler
from execbox.schedules.schemas import ScheduleCreate
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.conftest import wait_until
from tests.unit.conftest import InProcess, make_record

pytestmark = pytest.mark.redis
Headers = dict[str, dict[str, str]]
OPERATOR_TOKEN = "t" * 24
TICK = {"name": "tick", "version": "1.0.0", "code": "print('tick')\n", "input_schema": {"type": "object"}}
FORGED = {"execbox.script": "tick@1.0.0", "execbox.slot": "not-a-number"}


@pytest.fixture
def service(settings: Settings, client: redis.Redis) -> Iterator[tuple[InProcess, Headers]]:
    """The app in-process with an operator token, and keys for tenants alpha and beta."""
    auth = settings.auth.model_copy(update={"admin_token": SecretStr(OPERATOR_TOKEN)})
    keys = ApiKeys(client, settings.redis.key_prefix)
    headers = {tenant: {"Authorization": f"Bearer {keys.create(tenant)[0]}"} for tenant in ("alpha", "beta")}
    headers["operator"] = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    http = InProcess(create_app(settings.model_copy(update={"auth": auth})))
    yield http, headers
    http.close()


def end(
    store: ExecutionStore, execution_id: str, status: ExecutionStatus = ExecutionStatus.SUCCEEDED,
    stdout: str = "", outputs: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """End an execution as a worker would (queued → running → status), which emits its terminal event."""
    store.transition(execution_id, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)

    def finish(record: ExecutionRecord) -> ExecutionStatus:
        record.stdout, record.outputs = stdout, outputs or {}
        if status is ExecutionStatus.FAILED:
            record.error = ExecutionError(category=ErrorCategory.CODE_EXIT_NONZERO, message="exit 3", retryable=False)
        return status

    assert store.transition(execution_id, {ExecutionStatus.RUNNING}, "test", finish) is not None


def stored(settings: Settings, store: ExecutionStore, tenant: str, **fields: Any) -> str:
    """An execution written straight into Redis (as one stored before the fix could be): the fields
    given (labels, code, origin) on a queued record of tenant's."""
    record = ExecutionRecord.model_validate({**make_record(settings, tenant).model_dump(), **fields})
    store.create(record)
    return record.id


def surprise_ids(http: InProcess, headers: dict[str, str]) -> list[str]:
    return [e["execution_id"] for e in http.get("/v1/events", headers=headers).json()]


def request_models() -> Iterator[type[BaseModel]]:
    """Every strict model of the service (extra fields refused: what requests are parsed into)."""
    for module in pkgutil.walk_packages(execbox.__path__, "execbox."):
        importlib.import_module(module.name)
    todo, seen = list(BaseModel.__subclasses__()), set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        todo.extend(model.__subclasses__())
        if model.__module__.startswith("execbox.") and model.model_config.get("extra") == "forbid":
            yield model


# -- finding 1 (labels): the execbox. namespace is the service's -------------------------------------


def test_labels_in_the_execbox_namespace_are_refused_on_every_request_and_nothing_is_stored(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    assert http.post("/v1/scripts", json=TICK, headers=as_["alpha"]).status_code == 201
    step = {"id": "s", "run": {"code": "print(1)", "language": "python"}}
    attempts: dict[str, tuple[str, dict[str, Any]]] = {
        "POST /v1/executions": ("/v1/executions", {"language": "python", "code": "print(1)"}),
        "POST /v1/sessions": ("/v1/sessions", {"language": "python"}),
        "POST /v1/scripts/tick/invoke": ("/v1/scripts/tick/invoke", {"version": "1.0.0"}),
        "POST /v1/schedules": ("/v1/schedules", {"script": "tick@1.0.0", "cron": "0 0 1 1 *"}),
        "POST /v1/runs": ("/v1/runs", {"plan": {"format": "plan/v1", "steps": [step]}}),
    }
    for route, (path, body) in attempts.items():
        for labels, key in ((FORGED, "execbox.slot"), ({"EXECBOX.Run": "run_x"}, "EXECBOX.Run")):
            answer = http.post(path, json={**body, "labels": labels}, headers=as_["alpha"])
            assert answer.status_code == 422, f"{route}: {answer.status_code} {answer.text}"
            fields = {e["field"]: e["message"] for e in answer.json()["errors"]}
            assert "reserved" in fields[f"labels.{key}"], f"{route} names the label: {fields}"

    keys = Keys(settings.redis.key_prefix)
    assert list(client.scan_iter(match=keys.execution("*"))) == [], "no execution stored"
    for listing in ("/v1/schedules", "/v1/runs"):
        assert http.get(listing, headers=as_["alpha"]).json() == [], f"nothing stored behind {listing}"
    assert http.get("/v1/sessions", headers=as_["alpha"]).json()["sessions"] == [], "no session stored"
    ordinary = http.post("/v1/executions", json={"language": "python", "code": "print(1)",
                                                 "labels": {"team": "etl", "execboxed": "yes"}},
                         headers=as_["alpha"])  # fmt: skip
    assert ordinary.status_code == 202 and ordinary.json()["labels"] == {"team": "etl", "execboxed": "yes"}


def test_every_request_model_that_carries_labels_refuses_the_service_namespace() -> None:
    """The class, not the instances: a new request model with labels must use the shared type."""
    found = []
    for model in request_models():
        field = model.model_fields.get("labels")
        if field is None:
            continue
        full: Any = Annotated[field.annotation, *field.metadata]  # the field's type with its constraints
        adapter: TypeAdapter[Any] = TypeAdapter(full)
        with pytest.raises(ValidationError, match="reserved"):
            adapter.validate_python({"execbox.script": "x@1.0.0"})
        assert adapter.validate_python({"team": "etl"}) == {"team": "etl"}
        found.append(model.__name__)
    assert {"ExecutionCreate", "SessionCreate", "Invoke", "ScheduleCreate", "RunCreate"} <= set(found), found


def test_a_poisoned_slot_label_stored_before_the_fix_neither_stops_surprises_nor_makes_an_event(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    assert http.post("/v1/scripts", json=TICK, headers=as_["alpha"]).status_code == 201
    poison = stored(settings, store, "beta", labels=FORGED)
    end(store, poison, ExecutionStatus.FAILED)
    marker = http.post("/v1/scripts/tick/invoke", json={"version": "1.0.0"}, headers=as_["alpha"]).json()["id"]
    ended = time.monotonic()
    end(store, marker, ExecutionStatus.FAILED)

    wait_until(lambda: marker in surprise_ids(http, as_["alpha"]), 10, "alpha's surprise behind the poison")
    delay = time.monotonic() - ended
    print(f"alpha's script.failed event arrived {delay:.2f} s after its execution ended (poison ahead of it)")  # noqa: T201
    assert surprise_ids(http, as_["beta"]) == [], "a label is not a script link: no event for the poison"
    assert delay < 5.0


# -- finding 6: only the execution the dispatcher made for a step advances its run -----------------


def test_an_execution_labelled_with_a_run_does_not_advance_it_nor_delay_another_tenants_run(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    plan = {"format": "plan/v1", "steps": [{"id": "s", "run": {"code": "print(1)", "language": "python"}}]}
    target = http.post("/v1/runs", json={"plan": plan}, headers=as_["alpha"]).json()
    other = http.post("/v1/runs", json={"plan": plan}, headers=as_["beta"]).json()
    labelled = {"language": "python", "code": "print(1)", "labels": {"execbox.run": target["id"], "execbox.step": "s"}}
    refused = http.post("/v1/executions", json=labelled, headers=as_["alpha"])
    assert refused.status_code == 422, "the attacker cannot label an execution with its run"

    advanced: list[str] = []
    executor = http.app.state.services.runs.executor
    real: Callable[[str], Any] = executor.advance

    def counted(run_id: str) -> Any:  # the consumer's calls, counted (the real executor does the work)
        advanced.append(run_id)
        return real(run_id)

    monkeypatch.setattr(executor, "advance", counted)
    forged = [stored(settings, store, "alpha", labels=labelled["labels"]) for _ in range(40)]
    forged.append(stored(settings, store, "alpha", origin={"run": target["id"], "step": "s"}))  # not its attempt
    forged.append(stored(settings, store, "beta", origin={"run": target["id"], "step": "s"}))  # another tenant's
    for execution_id in forged:
        end(store, execution_id, ExecutionStatus.CANCELLED)

    events = len(other["events"])
    ended = time.monotonic()
    end(store, other["steps"]["s"]["attempts"][0], outputs={})
    after = http.get(f"/v1/runs/{other['id']}?wait=10&after={events}", headers=as_["beta"]).json()
    delay = time.monotonic() - ended
    print(f"beta's step settled {delay:.2f} s after its execution ended, behind 42 forged run links")  # noqa: T201
    assert after["status"] == "succeeded" and after["steps"]["s"]["status"] == "succeeded"
    assert target["id"] not in advanced, "no forged link advanced alpha's run"
    assert http.get(f"/v1/runs/{target['id']}", headers=as_["alpha"]).json()["steps"]["s"]["status"] == "running"
    assert delay < 5.0


# -- finding 10: a forged schedule link reaches no webhook --------------------------------------------


def test_a_forged_schedule_link_sends_no_script_failed_event_to_that_schedules_webhook(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store, keys = ExecutionStore(client, settings), Keys(settings.redis.key_prefix)
    for tenant in ("alpha", "beta"):
        assert http.post("/v1/scripts", json=TICK, headers=as_[tenant]).status_code == 201
    victim = http.app.state.services.schedules.create("alpha", ScheduleCreate.model_validate({
        "script": "tick@1.0.0", "cron": "0 0 1 1 *",
        "webhook": {"url": "https://hooks.example.com/alpha", "secret": "alpha-secret-0123456789"}}))  # fmt: skip
    link = {"execbox.script": "tick@1.0.0", "execbox.schedule": victim.id}
    refused = http.post("/v1/executions", json={"language": "python", "code": "print('x')", "labels": link},
                        headers=as_["beta"])  # fmt: skip
    assert refused.status_code == 422

    by_label = stored(settings, store, "beta", labels=link)
    by_origin = stored(settings, store, "beta", origin={"script": "tick@1.0.0", "schedule": victim.id, "slot": 1.0})
    for execution_id in (by_label, by_origin):
        end(store, execution_id, ExecutionStatus.FAILED, stdout="the attacker's stdout")
    marker = http.post("/v1/scripts/tick/invoke", json={"version": "1.0.0"}, headers=as_["beta"]).json()["id"]
    end(store, marker, ExecutionStatus.FAILED)
    wait_until(lambda: marker in surprise_ids(http, as_["beta"]), 10, "beta's own surprise")

    for execution_id in (by_label, by_origin):
        assert client.get(keys.surprise(execution_id)) is None, "nothing stored for the victim's webhook"
    outbox: Any = client.xrange(keys.events)
    sent = [f for _, f in outbox if f.get(b"type") == b"script.failed"]
    assert not [f for f in sent if f.get(b"id") in (by_label.encode(), by_origin.encode())], "no delivery queued"
    events = {e["execution_id"]: e for e in http.get("/v1/events", headers=as_["beta"]).json()}
    assert by_label not in events, "a label is not a script link"
    assert events[by_origin]["schedule"] is None, "another tenant's schedule is not named in beta's event"
    assert surprise_ids(http, as_["alpha"]) == [], "the victim's stream is untouched"


# -- finding 8: the operator's shared script is the operator's ----------------------------------------


def test_a_tenant_cannot_promote_or_deprecate_the_operators_shared_script(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    for version in ("1.0.0", "1.1.0"):
        shared = {**TICK, "name": "shared.tick", "version": version}
        assert http.post("/v1/admin/scripts", json=shared, headers=as_["operator"]).status_code == 201
    ran = http.post("/v1/scripts/shared.tick/invoke", json={"version": "1.0.0"}, headers=as_["beta"]).json()["id"]
    end(store, ran)

    proven = http.post("/v1/scripts/shared.tick/versions/1.0.0/promote", headers=as_["beta"],
                       json={"status": "proven", "evidence": [ran]})  # fmt: skip
    deprecated = http.post("/v1/scripts/shared.tick/versions/1.1.0/promote", headers=as_["beta"],
                           json={"status": "deprecated"})  # fmt: skip
    assert (proven.status_code, deprecated.status_code) == (404, 404), (proven.text, deprecated.text)
    assert "operator" in proven.json()["detail"]
    statuses = {v["version"]: v["status"] for v in
                http.get("/v1/scripts/shared.tick", headers=as_["alpha"]).json()["versions"]}  # fmt: skip
    assert statuses == {"1.0.0": "draft", "1.1.0": "draft"}, "every tenant still sees the operator's statuses"

    by_operator = http.post("/v1/admin/scripts/shared.tick/versions/1.0.0/promote", headers=as_["operator"],
                            json={"status": "proven", "evidence": [ran]})  # fmt: skip
    assert by_operator.status_code == 200 and by_operator.json()["status"] == "proven"


# -- finding 9: evidence is an execution the service ran for that exact version ----------------------


def test_print_not_the_script_labelled_as_the_script_does_not_prove_it(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    failing = {**TICK, "name": "always.fails", "code": "raise SystemExit(3)\n"}
    assert http.post("/v1/scripts", json=failing, headers=as_["alpha"]).status_code == 201
    for tenant in ("alpha", "beta"):  # beta's own script of the same name and content
        http.post("/v1/scripts", json={**failing, "name": "other"}, headers=as_[tenant])
    label = {"execbox.script": "always.fails@1.0.0"}
    refused = http.post("/v1/executions", json={"language": "python", "code": "print('not the script')",
                                                "labels": label}, headers=as_["alpha"])  # fmt: skip
    assert refused.status_code == 422

    script = http.get("/v1/scripts/always.fails/versions/1.0.0", headers=as_["alpha"]).json()
    link = {"script": "always.fails@1.0.0", "script_sha256": script["sha256"]}
    by_label = stored(settings, store, "alpha", code="print('not the script')\n", labels=label)
    by_origin_other_code = stored(settings, store, "alpha", code="print('not the script')\n", origin=link)
    by_other_tenant = stored(settings, store, "beta", code=failing["code"], origin=link)
    for execution_id in (by_label, by_origin_other_code, by_other_tenant):
        end(store, execution_id)
    promote = "/v1/scripts/always.fails/versions/1.0.0/promote"
    for evidence in (by_label, by_origin_other_code, by_other_tenant):
        answer = http.post(promote, json={"status": "proven", "evidence": [evidence]}, headers=as_["alpha"])
        assert answer.status_code == 422, answer.text
        assert "not an execution the service ran" in answer.json()["errors"][0]["message"]
    status = http.get("/v1/scripts/always.fails/versions/1.0.0", headers=as_["alpha"]).json()["status"]
    assert status == "draft", "the failing script is not proven"

    invoked = http.post("/v1/scripts/always.fails/invoke", json={"version": "1.0.0"}, headers=as_["alpha"]).json()
    end(store, invoked["id"])  # the script itself, run by the service (here it succeeded)
    answer = http.post(promote, json={"status": "proven", "evidence": [invoked["id"]]}, headers=as_["alpha"])
    assert answer.status_code == 200 and answer.json()["status"] == "proven"


def test_a_schedule_firing_of_the_version_is_evidence(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    assert http.post("/v1/scripts", json=TICK, headers=as_["alpha"]).status_code == 201
    services = http.app.state.services
    clock = [2_000_000_000.0]
    scheduler = Scheduler(services.schedules.store, services.scripts, services.store, clock=lambda: clock[0])
    schedule = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * *"))
    clock[0] += 61
    scheduler.tick()
    fired = [f for f in http.get(f"/v1/schedules/{schedule.id}/firings", headers=as_["alpha"]).json()
             if f["status"] == "fired"]  # fmt: skip
    assert fired, "the slot fired"
    record = store.get(fired[0]["execution_id"])
    assert record is not None and record.origin is not None
    assert (record.origin.schedule, record.origin.script) == (schedule.id, "tick@1.0.0") and record.labels == {}
    end(store, record.id)
    answer = http.post("/v1/scripts/tick/versions/1.0.0/promote", headers=as_["alpha"],
                       json={"status": "proven", "evidence": [record.id]})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["status"] == "proven"


def test_records_stored_with_label_links_still_load_and_read(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    store = ExecutionStore(client, settings)
    old = make_record(settings, "alpha").model_dump(mode="json", exclude={"origin"})
    old["labels"] = {**FORGED, "execbox.run": "run_x", "team": "etl"}
    client.set(Keys(settings.redis.key_prefix).execution(old["id"]), ExecutionRecord.model_validate(old)
               .model_dump_json(exclude={"origin"}))  # fmt: skip
    record = store.get(old["id"])
    assert record is not None and record.origin is None and record.labels == old["labels"]
    answer = http.get(f"/v1/executions/{old['id']}", headers=as_["alpha"])
    assert answer.status_code == 200 and answer.json()["labels"] == old["labels"]


def test_a_step_execution_stored_before_origins_still_advances_its_run(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    """Upgrade: a step's execution written with the old label links (no origin) ends; its run, which
    lists that very execution, still advances (the same check as for an origin)."""
    http, as_ = service
    store, keys = ExecutionStore(client, settings), Keys(settings.redis.key_prefix)
    plan = {"format": "plan/v1", "steps": [{"id": "s", "run": {"code": "print(1)", "language": "python"}}]}
    run = http.post("/v1/runs", json={"plan": plan}, headers=as_["alpha"]).json()
    attempt = run["steps"]["s"]["attempts"][0]
    record = store.get(attempt)
    assert record is not None
    old = record.model_copy(update={"labels": {"execbox.run": run["id"], "execbox.step": "s"}})
    client.set(keys.execution(attempt), old.model_dump_json(exclude={"origin"}))

    end(store, attempt)
    after = http.get(f"/v1/runs/{run['id']}?wait=10&after={len(run['events'])}", headers=as_["alpha"]).json()
    assert after["steps"]["s"]["status"] == "succeeded" and after["status"] == "succeeded"


def test_a_schedule_stored_with_a_reserved_label_fires_as_not_started_naming_it(
    service: tuple[InProcess, Headers], client: redis.Redis, settings: Settings
) -> None:
    http, as_ = service
    assert http.post("/v1/scripts", json=TICK, headers=as_["alpha"]).status_code == 201
    services = http.app.state.services
    clock = [2_000_000_000.0]
    scheduler = Scheduler(services.schedules.store, services.scripts, services.store, clock=lambda: clock[0])
    schedule = scheduler.create("alpha", ScheduleCreate(script="tick@1.0.0", cron="* * * * *"))
    schedule.labels = {"execbox.schedule": "sch_" + "x" * 26}  # as stored before labels were checked
    scheduler.save(schedule)
    clock[0] += 61
    scheduler.tick()

    firings = http.get(f"/v1/schedules/{schedule.id}/firings", headers=as_["alpha"]).json()
    assert firings and {f["status"] for f in firings} == {"not_started"}
    assert "labels.execbox.schedule" in firings[0]["detail"] and "reserved" in firings[0]["detail"]
