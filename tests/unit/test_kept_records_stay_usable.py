"""What is kept stays usable: a webhook stored before requests were checked more strictly is still read
(records read it with StoredWebhook, requests check it with Webhook), and a script's schemas are
compiled when it is registered rather than at its first invocation."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from pydantic import ValidationError

from execbox.executions.schemas import StoredWebhook, Webhook
from execbox.executions.store import ExecutionStore
from execbox.schedules.schemas import Schedule
from execbox.settings import Settings
from tests.unit.conftest import InProcess, make_record

UNSENDABLE = "http://hooks.example.com/\x01"  # passes the URL pattern; httpx cannot make a request of it
SECRET = "s" * 16


def test_a_webhook_url_no_request_can_be_made_of_is_refused_on_requests() -> None:
    with pytest.raises(ValidationError, match="no request can be sent"):
        Webhook(url=UNSENDABLE, secret=SECRET)


def test_an_execution_stored_with_such_a_webhook_is_still_read(
    settings: Settings, client: redis.Redis, api: tuple[InProcess, dict[str, dict[str, str]]]
) -> None:
    http, headers = api
    record = make_record(settings).model_copy(update={"webhook": StoredWebhook(url=UNSENDABLE, secret=SECRET)})
    ExecutionStore(client, settings).create(record)  # as a version without the request check stored it

    answer = http.get(f"/v1/executions/{record.id}", headers=headers["alpha"])

    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == record.id


def test_a_schedule_stored_with_such_a_webhook_is_still_read() -> None:
    stored: dict[str, Any] = {
        "script": "report@1.0.0",
        "cron": "0 9 * * 1",
        "webhook": {"url": UNSENDABLE, "secret": SECRET},
        "id": "sch_" + "a" * 26,
        "tenant": "alpha",
        "created_at": 1.0,
        "last_slot": 1.0,
    }
    assert Schedule.model_validate(stored).webhook == StoredWebhook(url=UNSENDABLE, secret=SECRET)


@pytest.mark.parametrize("field", ["input_schema", "output_schema"])
def test_a_script_whose_schema_cannot_resolve_is_refused_and_nothing_is_registered(
    api: tuple[InProcess, dict[str, dict[str, str]]], field: str
) -> None:
    """A $ref that resolves nowhere would fail every invocation (or every output check) of a stored
    version; it is a 422 at registration naming the schema, and the name stays unknown."""
    http, headers = api
    body = {"name": "report", "version": "1.0.0", "code": "print(1)", field: {"$ref": "#/$defs/missing"}}

    answer = http.post("/v1/scripts", json=body, headers=headers["alpha"])

    assert answer.status_code == 422, answer.text
    assert any(problem["field"] == field for problem in answer.json()["errors"]), answer.json()
    assert http.get("/v1/scripts/report", headers=headers["alpha"]).status_code == 404
