"""Webhook delivery: a consumer of the event stream, off the execution path.

Every terminal status change is an entry of the event stream (written in the same transaction as
the change, see execbox.executions.events). Each worker process runs one consumer thread of the `webhooks`
group: it takes new entries, and entries another consumer took but never acknowledged (it died)
once they have been idle for `claim_idle_s`; for an execution with a webhook it POSTs the finished
execution, signed, and acknowledges the entry only after that attempt is recorded. A failed
attempt is rescheduled on a delayed set with exponential backoff and jitter, up to
`max_attempts`; nothing ever sleeps in the thread that runs executions. Each attempt is logged on
the execution (`webhook_deliveries`); receivers deduplicate on `Execbox-Execution-Id` (a consumer
that dies after sending and before acknowledging causes one repeat). Redirects are not followed
and the host is checked against the operator's allowlist again at delivery time. A URL no request
can be made of is a failed attempt that is not repeated; anything else that raises while handling
one entry or retry is retried with backoff and then set aside as a dead letter
(execbox.core.poison), so one bad entry never stops the deliveries of everyone else.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import secrets
import threading
import time
from functools import partial
from typing import Any

import httpx

from execbox.catalog.webhook_hosts import host_allowed
from execbox.core import logs
from execbox.core.metrics import LoopMetrics
from execbox.core.poison import Guard, consume
from execbox.core.streams import TERMINAL, DueSet
from execbox.executions.events import consumer_group
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import StoredWebhook, WebhookDelivery
from execbox.executions.store import ExecutionStore
from execbox.plans import handoff
from execbox.plans.store import RunStore
from execbox.schedules.surprises import stored_surprise
from execbox.webhooks.keys import WebhookKeys
from execbox.webhooks.settings import WebhookSettings

log = logging.getLogger(__name__)
GROUP = consumer_group("webhooks")
RUN_EVENTS = ("run.needs_replan", "run.finished", "approval.requested", "input.requested")
SCRIPT_EVENTS = ("script.failed", "script.succeeded")
UNSENDABLE = "unsendable: "
"""An attempt's error when no request can be made of the URL at all (a stored URL no longer
accepted, say): a failed delivery that is not tried again."""


def sign(secret: str, body: bytes, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


class WebhookConsumer:
    def __init__(self, store: ExecutionStore, settings: WebhookSettings, name: str,
                 metrics: LoopMetrics | None = None) -> None:  # fmt: skip
        self._store = store
        self._keys = WebhookKeys(store.keys.prefix)  # the runs' and surprises' keys too, not only executions'
        self._retries = DueSet(store.redis, self._keys.due("webhooks"))
        """Executions (by id) and run events (as JSON) whose next delivery attempt is due at a time."""
        self._runs = RunStore(store.redis, self._keys, 0)  # read only
        self._settings = settings
        self._name = name
        self.guard = Guard(store.redis, store.keys, "webhooks", (store.keys.events, self._retries.key), metrics)
        """An entry or retry whose handling raises is tried again with backoff, then set aside."""

    def run(self, stop: threading.Event) -> None:
        consume(self._store.events, GROUP, self._name, self.handle, stop, self.guard, self._settings.claim_idle_s,
                block_s=1.0, before=self.retry_due)  # fmt: skip

    def retry_due(self) -> None:
        for member in self._retries.take_due():
            self.guard.record(self._retries.key, member, partial(self._retry, member), taken=True)

    def _retry(self, member: str) -> None:
        if member.startswith("{"):
            self._deliver_event(json.loads(member))
        else:
            self._deliver(member)

    def handle(self, event: dict[str, str]) -> None:
        if event.get("type") == TERMINAL:
            self._deliver(event["id"])
        elif event.get("type") in (*RUN_EVENTS, *SCRIPT_EVENTS):
            self._deliver_event({**event, "attempt": "1"})

    def _retry_at(self, attempt: int) -> float:
        """When the attempt after `attempt` is due: exponential backoff plus up to 50% jitter."""
        delay = self._settings.backoff_s * 2 ** (attempt - 1)
        return float(time.time() + delay + random.uniform(0, delay / 2))

    def _deliver_event(self, event: dict[str, str]) -> None:
        """A run's event (the run, with its hand-off when it needs a re-plan, or the approval asked
        for) or a failed scheduled script's (`script.failed`). Attempts are counted in the retry
        entry (workers cannot write runs or events)."""
        found = self._payload(event)
        if found is None:
            return
        payload, webhook, trace_id, headers = found
        attempt, settings = int(event["attempt"]), self._settings
        with logs.bound(trace_id, None):
            if not _allowed(webhook.url, settings.allow_hosts):
                log.warning("webhook host no longer allowed by the operator; %s not sent", event["type"])
                return
            body = json.dumps(payload).encode()
            headers = {"Execbox-Event": event["type"], **headers}
            status, error = _post(webhook.url, webhook.secret, body, headers, attempt, trace_id, settings.timeout_s)
            if error is None:
                log.info("event delivered", extra={"event": event["type"], "attempt": attempt, "status_code": status})
            elif attempt < settings.max_attempts and not error.startswith(UNSENDABLE):
                retry = json.dumps({**event, "attempt": str(attempt + 1)}, sort_keys=True)
                self._retries.schedule(retry, self._retry_at(attempt))
            else:
                log.warning("%s not delivered after %d attempts: %s", event["type"], attempt, error)

    def _payload(self, event: dict[str, str]) -> tuple[dict[str, Any], StoredWebhook, str, dict[str, str]] | None:
        """(body, webhook, trace id, headers) of an event, or None when there is nothing to send."""
        if event["type"] in SCRIPT_EVENTS:
            stored = stored_surprise(self._store.redis, self._keys, event["id"])
            if stored is None:
                return None
            surprise, webhook = stored
            record = self._store.get(event["id"])
            trace_id = record.trace_id if record else "0" * 32
            return {"type": event["type"], "event": surprise}, webhook, trace_id, {"Execbox-Execution-Id": event["id"]}
        run = self._runs.get(event["id"])
        if run is None or run.webhook is None:
            return None
        payload: dict[str, Any] = {"type": event["type"], "run": run.public().model_dump(mode="json")}
        if event["type"] == "run.needs_replan" and run.status.revisable:
            payload["handoff"] = handoff.build(run, self._store.get).model_dump(mode="json")
        if event.get("approval"):
            approval = self._runs.approval(event["approval"])
            payload["approval"] = approval.model_dump(mode="json", exclude={"tenant"}) if approval else None
        if event.get("step"):
            payload["step"] = event["step"]  # the input step that waits (its request is in the run)
        return payload, run.webhook, run.trace_id, {"Execbox-Run-Id": run.id}

    def _deliver(self, execution_id: str) -> None:
        record = self._store.get(execution_id)
        if record is None or record.webhook is None:
            return
        settings = self._settings
        attempt = len(record.webhook_deliveries) + 1
        if attempt > settings.max_attempts or any(d.error is None for d in record.webhook_deliveries):
            return  # delivered already, or given up: an entry seen twice changes nothing
        with logs.bound(record.trace_id, execution_id):
            if not _allowed(record.webhook.url, settings.allow_hosts):
                self._log(execution_id, attempt, None, "host no longer allowed by the operator; not sent")
                return
            status, error = _attempt(record, attempt, settings.timeout_s)
            self._log(execution_id, attempt, status, error)
            if error is None:
                log.info("webhook delivered", extra={"attempt": attempt, "status_code": status})
            elif attempt < settings.max_attempts and not error.startswith(UNSENDABLE):
                self._retries.schedule(execution_id, self._retry_at(attempt))
            else:
                log.warning("webhook not delivered after %d attempts", settings.max_attempts)

    def _log(self, execution_id: str, attempt: int, status: int | None, error: str | None) -> None:
        entry = WebhookDelivery(attempt=attempt, at=time.time(), status_code=status, error=error)
        self._store.update(execution_id, lambda record: record.webhook_deliveries.append(entry))


def _allowed(url: str, patterns: list[str]) -> bool:
    """The host is on the operator's list (a URL whose host cannot even be read is not)."""
    try:
        return host_allowed(url, patterns)
    except ValueError:
        return False


def _attempt(record: ExecutionRecord, attempt: int, timeout_s: float) -> tuple[int | None, str | None]:
    assert record.webhook is not None
    body = record.public().model_dump_json().encode()
    headers = {"Execbox-Execution-Id": record.id}
    return _post(record.webhook.url, record.webhook.secret, body, headers, attempt, record.trace_id, timeout_s)


def _post(
    url: str, secret: str, body: bytes, extra: dict[str, str], attempt: int, trace_id: str, timeout_s: float
) -> tuple[int | None, str | None]:
    headers = {
        "Content-Type": "application/json",
        "Execbox-Signature": sign(secret, body, int(time.time())),
        "Execbox-Delivery-Attempt": str(attempt),
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        **extra,
    }
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as http:
            response = http.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
    except (httpx.InvalidURL, ValueError) as exc:  # not an HTTPError: no request can be made of this URL
        return None, f"{UNSENDABLE}{type(exc).__name__}: {exc}"[:300]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"answered {response.status_code}"
