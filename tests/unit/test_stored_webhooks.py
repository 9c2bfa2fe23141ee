"""A webhook stored before requests were checked more strictly stays readable: the records read it
with the model they were written with (StoredWebhook), the requests check it (Webhook)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from pydantic import ValidationError

from execbox.core.settings import Settings
from execbox.executions.schemas import StoredWebhook, Webhook
from execbox.executions.store import ExecutionStore
from execbox.schedules.schemas import Schedule
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
