"""deliver: the RQ job that POSTs a finished execution to its webhook, signed, with retries.

Retries on network errors and non-2xx answers, with exponential backoff and jitter, up to
`max_attempts`; each attempt is logged on the execution (`webhook_deliveries`). Redirects are not
followed and the host is checked against the operator's allowlist again at delivery time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import secrets
import time
from typing import Any

import httpx

from execbox import logs
from execbox.models import ExecutionRecord, WebhookDelivery
from execbox.webhook_policy import host_allowed
from execbox.worker.context import current

log = logging.getLogger(__name__)


def sign(secret: str, body: bytes, timestamp: int) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def deliver(payload: dict[str, Any]) -> str:
    ctx = current()
    execution_id = str(payload["execution_id"])
    record = ctx.store.get(execution_id)
    if record is None or record.webhook is None:
        return "nothing to deliver"
    settings = ctx.settings.webhooks
    with logs.bound(record.trace_id, execution_id):
        if not host_allowed(record.webhook.url, settings.allow_hosts):
            _log_attempt(ctx, execution_id, 1, None, "host no longer allowed by the operator; not sent")
            return "refused"
        body = record.public().model_dump_json().encode()
        with httpx.Client(timeout=settings.timeout_s, follow_redirects=False) as http:
            for attempt in range(1, settings.max_attempts + 1):
                status, error = _attempt(http, record, body)
                _log_attempt(ctx, execution_id, attempt, status, error)
                if error is None:
                    log.info("webhook delivered", extra={"attempt": attempt, "status_code": status})
                    return "delivered"
                if attempt < settings.max_attempts:
                    delay = settings.backoff_s * 2 ** (attempt - 1)
                    time.sleep(delay + random.uniform(0, delay / 2))  # jitter, not a secret
        log.warning("webhook not delivered after %d attempts", settings.max_attempts)
        return "gave up"


def _attempt(http: httpx.Client, record: ExecutionRecord, body: bytes) -> tuple[int | None, str | None]:
    assert record.webhook is not None
    headers = {
        "Content-Type": "application/json",
        "Execbox-Signature": sign(record.webhook.secret, body, int(time.time())),
        "Execbox-Execution-Id": record.id,
        "traceparent": f"00-{record.trace_id}-{secrets.token_hex(8)}-01",
    }
    try:
        response = http.post(record.webhook.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:300]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"answered {response.status_code}"


def _log_attempt(ctx: Any, execution_id: str, attempt: int, status: int | None, error: str | None) -> None:
    entry = WebhookDelivery(attempt=attempt, at=time.time(), status_code=status, error=error)
    ctx.store.update(execution_id, lambda record: record.webhook_deliveries.append(entry))
