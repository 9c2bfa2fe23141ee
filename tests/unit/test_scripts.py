"""The script library in-process against a real Redis: immutable versions, search, promotion on
evidence, invocation with schema-checked inputs, and plan steps that name a script."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from pydantic import SecretStr

from execbox.api import create_app
from execbox.executions.record import ExecutionRecord
from execbox.executions.status import ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.settings import Settings
from execbox.tenancy.apikeys import ApiKeys
from tests.unit.conftest import InProcess

pytestmark = pytest.mark.redis
Api = tuple[InProcess, dict[str, dict[str, str]]]
REPORT = {
    "name": "reports.weekly_errors", "version": "1.0.0", "language": "python",
    "code": "import execbox\nexecbox.emit('errors', len(execbox.inputs['logs']))\n",
    "description": "Count the error lines of a week of instrument logs", "tags": ["reports", "logs"],
    "input_schema": {"type": "object", "required": ["logs", "week"],
                     "properties": {"logs": {"type": "array", "items": {"type": "string"}},
                                    "week": {"type": "string", "pattern": "^[0-9]{4}-W[0-9]{2}$"}}},
    "output_schema": {"type": "object", "required": ["errors"], "properties": {"errors": {"type": "integer"}}},
}  # fmt: skip


def succeed(client: redis.Redis, settings: Settings, execution_id: str, outputs: dict[str, Any]) -> None:
    store = ExecutionStore(client, settings)
    store.transition(execution_id, {ExecutionStatus.QUEUED}, "test", lambda r: ExecutionStatus.RUNNING)

    def end(record: ExecutionRecord) -> ExecutionStatus:
        record.outputs = outputs
        return ExecutionStatus.SUCCEEDED

    store.transition(execution_id, {ExecutionStatus.RUNNING}, "test", end)


def test_versions_are_immutable_and_the_same_registration_replays(api: Api) -> None:
    http, as_ = api
    first = http.post("/v1/scripts", json=REPORT, headers=as_["alpha"])
    again = http.post("/v1/scripts", json=REPORT, headers=as_["alpha"])
    changed = http.post("/v1/scripts", json={**REPORT, "code": "print('other')"}, headers=as_["alpha"])
    bad_schema = http.post("/v1/scripts", json={**REPORT, "version": "1.0.1", "input_schema": {"type": 3}},
                           headers=as_["alpha"])  # fmt: skip

    assert first.status_code == 201 and first.json()["status"] == "draft"
    assert again.status_code == 200 and again.json()["sha256"] == first.json()["sha256"]
    assert changed.status_code == 409 and "immutable" in changed.json()["detail"]
    assert bad_schema.status_code == 422
    assert http.get("/v1/scripts/reports.weekly_errors", headers=as_["beta"]).status_code == 404, "per tenant"


def test_search_finds_by_words_and_tags_and_lists_versions(api: Api) -> None:
    http, as_ = api
    for version in ("1.0.0", "1.2.0", "1.10.0"):
        http.post("/v1/scripts", json={**REPORT, "version": version}, headers=as_["alpha"])
    http.post("/v1/scripts", json={**REPORT, "name": "etl.load", "tags": ["etl"], "description": "Load rows"},
              headers=as_["alpha"])  # fmt: skip

    by_word = http.get("/v1/scripts?q=instrument", headers=as_["alpha"]).json()
    by_tag = http.get("/v1/scripts?tag=etl", headers=as_["alpha"]).json()
    versions = http.get("/v1/scripts/reports.weekly_errors", headers=as_["alpha"]).json()["versions"]

    assert [s["name"] for s in by_word] == ["reports.weekly_errors"] and by_word[0]["latest"] == "1.10.0"
    assert [s["name"] for s in by_tag] == ["etl.load"]
    assert [v["version"] for v in versions] == ["1.0.0", "1.2.0", "1.10.0"], "semantic order, not text order"


def test_invoking_checks_inputs_and_promotion_needs_succeeded_executions_of_the_version(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    http, as_ = api
    http.post("/v1/scripts", json=REPORT, headers=as_["alpha"])
    invalid = http.post("/v1/scripts/reports.weekly_errors/invoke", headers=as_["alpha"],
                        json={"version": "1.0.0", "inputs": {"logs": [1], "week": "last"}})  # fmt: skip
    assert invalid.status_code == 422
    assert {e["field"] for e in invalid.json()["errors"]} == {"inputs.logs.0", "inputs.week"}
    no_proven = http.post("/v1/scripts/reports.weekly_errors/invoke", json={"inputs": {}}, headers=as_["alpha"])
    assert no_proven.status_code == 404 and "proven" in no_proven.json()["detail"]

    ran = http.post("/v1/scripts/reports.weekly_errors/invoke", headers=as_["alpha"],
                    json={"version": "1.0.0", "inputs": {"logs": ["a"], "week": "2026-W48"}}).json()  # fmt: skip
    record = ExecutionStore(client, settings).get(ran["id"])
    assert record is not None and record.origin is not None
    assert record.origin.script == "reports.weekly_errors@1.0.0" and not record.labels
    assert record.expect is not None and record.expect.outputs_schema == REPORT["output_schema"]
    empty = http.post("/v1/scripts/reports.weekly_errors/versions/1.0.0/promote", json={"status": "proven"},
                      headers=as_["alpha"])  # fmt: skip
    unfinished = http.post("/v1/scripts/reports.weekly_errors/versions/1.0.0/promote", headers=as_["alpha"],
                           json={"status": "proven", "evidence": [ran["id"]]})  # fmt: skip
    assert empty.status_code == 422 and unfinished.status_code == 422, "no evidence, or not a success"

    succeed(client, settings, ran["id"], {"errors": 1})
    proven = http.post("/v1/scripts/reports.weekly_errors/versions/1.0.0/promote", headers=as_["alpha"],
                       json={"status": "proven", "evidence": [ran["id"]]})  # fmt: skip
    assert proven.status_code == 200 and proven.json()["status"] == "proven"
    detail = http.get("/v1/scripts/reports.weekly_errors", headers=as_["alpha"]).json()["versions"][0]
    assert detail["uses"] == 1 and detail["evidence"] == [ran["id"]]


def test_a_plan_step_runs_the_newest_proven_version_and_records_which(
    api: Api, client: redis.Redis, settings: Settings
) -> None:
    http, as_ = api
    evidence = {}
    for version in ("1.0.0", "1.1.0", "2.0.0-rc.1"):
        http.post("/v1/scripts", json={**REPORT, "version": version}, headers=as_["alpha"])
        ran = http.post("/v1/scripts/reports.weekly_errors/invoke", headers=as_["alpha"],
                        json={"version": version, "inputs": {"logs": [], "week": "2026-W01"}}).json()  # fmt: skip
        succeed(client, settings, ran["id"], {"errors": 0})
        evidence[version] = ran["id"]
    for version in ("1.0.0", "1.1.0"):
        http.post(f"/v1/scripts/reports.weekly_errors/versions/{version}/promote", headers=as_["alpha"],
                  json={"status": "proven", "evidence": [evidence[version]]})  # fmt: skip
    step = {"id": "report", "run": {"script": "reports.weekly_errors@proven"},
            "args": {"logs": {"$ref": "/inputs/logs"}, "week": "2026-W48"}}  # fmt: skip
    run = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "inputs": {"logs": ["x", "y"]}, "steps": [step]}},
                    headers=as_["alpha"]).json()  # fmt: skip

    state = run["steps"]["report"]
    assert state["script"] == "reports.weekly_errors@1.1.0", "the newest proven one, not the draft 2.0.0-rc.1"
    record = ExecutionStore(client, settings).get(state["attempts"][0])
    assert record is not None and record.inputs == {"logs": ["x", "y"], "week": "2026-W48"}
    assert record.origin is not None
    assert record.origin.script == "reports.weekly_errors@1.1.0" and record.origin.run == run["id"]
    missing = http.post("/v1/plans/validate", headers=as_["alpha"],
                        json={"format": "plan/v1", "steps": [{**step, "run": {"script": "nope@proven"}}]})  # fmt: skip
    assert missing.status_code == 422 and missing.json()["errors"][0]["field"] == "plan.steps.0.run.script"
    literal = {**step, "id": "bad", "args": {"logs": "not a list", "week": "2026-W48"}}
    refused = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "steps": [literal]}}, headers=as_["alpha"])
    assert refused.status_code == 422, "a literal argument the script refuses is refused before anything runs"
    assert [e["field"] for e in refused.json()["errors"]] == ["plan.steps.0.args.logs"]
    referred = {**step, "id": "bad", "args": {"logs": {"$ref": "/inputs/logs"}, "week": "2026-W48"}}
    failed = http.post("/v1/runs", json={"plan": {"format": "plan/v1", "inputs": {"logs": "not a list"},
                                              "steps": [referred]}}, headers=as_["alpha"]).json()  # fmt: skip
    assert failed["status"] == "needs_replan" and failed["steps"]["bad"]["error"]["category"] == "input.invalid"


def test_the_operators_shared_scripts_reach_every_tenant(settings: Settings, client: redis.Redis) -> None:
    admin = settings.model_copy(update={"auth": settings.auth.model_copy(update={"admin_token": SecretStr("t" * 24)})})
    keys = ApiKeys(client, settings.redis.key_prefix)
    alpha, beta = ({"Authorization": f"Bearer {keys.create(t)[0]}"} for t in ("alpha", "beta"))
    operator = {"Authorization": "Bearer " + "t" * 24}
    http = InProcess(create_app(admin))
    try:
        shared = {**REPORT, "name": "shared.errors"}
        assert http.post("/v1/admin/scripts", json=shared, headers=alpha).status_code == 403, "tenants cannot publish"
        assert http.post("/v1/admin/scripts", json=shared, headers=operator).status_code == 201
        found = http.get("/v1/scripts?q=instrument", headers=beta).json()
        assert [(s["name"], s["shared"]) for s in found] == [("shared.errors", True)]
        ran = http.post("/v1/scripts/shared.errors/invoke", headers=beta,
                        json={"version": "1.0.0", "inputs": {"logs": [], "week": "2026-W01"}}).json()  # fmt: skip
        succeed(client, settings, ran["id"], {"errors": 0})
        promoted = http.post("/v1/admin/scripts/shared.errors/versions/1.0.0/promote", headers=operator,
                             json={"status": "proven", "evidence": [ran["id"]]})  # fmt: skip
        assert promoted.status_code == 200, promoted.text
        assert http.get("/v1/scripts/shared.errors", headers=alpha).json()["versions"][0]["uses"] == 1
        own = {**REPORT, "name": "shared.errors", "version": "9.0.0", "description": "alpha's own"}
        http.post("/v1/scripts", json=own, headers=alpha)
        assert [v["version"] for v in http.get("/v1/scripts/shared.errors", headers=alpha).json()["versions"]] == [
            "9.0.0"], "a tenant's own script of that name comes first"  # fmt: skip
    finally:
        http.close()
