"""The deployment's settings: every room's section assembled into the one `Settings` each entry point
builds once (`create_app(settings)`, `run_worker(settings, ...)`, the CLI).

It sits above the rooms and below the entry points (pyproject's import-linter layers), as
`execbox.keyschema` does for keys: a room declares its section in `<room>/settings.py` and never
imports this module; its functions take their section, or the room's own Protocol of what they read
(`ExecutionsConfig`, `SessionsConfig`, `EgressConfig`), which `Settings` satisfies. The API's own
section is here, since the API sits above this layer. The fields keep their order: it is the order of
the configuration reference (docs/operations.md, `execbox.core.config_reference`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from execbox.core.settings import REPO_ROOT, RedisSettings, SettingsRoot, TelemetrySettings
from execbox.e2b.settings import E2bSettings
from execbox.egress.settings import EgressSettings
from execbox.executions.settings import QueueSettings, WorkerSettings
from execbox.files.settings import ArtifactSettings
from execbox.plans.settings import PlanSettings
from execbox.sandbox.settings import DockerSettings, PoolSettings
from execbox.sessions.settings import SessionSettings
from execbox.tenancy.settings import AuthSettings
from execbox.webhooks.settings import WebhookSettings


class ApiSettings(BaseModel):
    shutdown_grace_s: int = Field(
        5,
        ge=0,
        le=300,
        description="On SIGTERM, how long requests still open may finish (an event stream never does; its "
        "client resumes with Last-Event-ID) before they are ended and the process exits.",
    )
    idempotency_ttl_s: int = Field(24 * 3600, ge=60, description="How long an Idempotency-Key is remembered.")
    max_wait_s: float = Field(60.0, ge=0, description="Longest a client may ask POST/GET to wait for completion.")
    max_body_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Largest body of the upload routes, POST /v1/executions (input files ride in it) and POST "
        "/v1/files (413 above). Larger inputs: several uploaded files, used by id.",
    )
    max_json_body_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="Largest body of every other route that takes a JSON model (plans, runs, schedules...; a route "
        "of a few short fields takes 32 KiB, one without a body 4 KiB; 413 above). Bodies are parsed off the event "
        "loop, at most two at once, so this also bounds the memory parsing takes.",
    )
    sse_keepalive_s: float = Field(
        15.0, gt=0, le=300, description="A live-event stream (SSE) sends a keepalive comment after this long quiet."
    )
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A request's head (request line and headers) must arrive within this long of its first byte (of "
        "the connection, for the first request); past it the connection is closed, so half a head holds nothing.",
    )
    max_head_bytes: int = Field(
        64 * 1024, ge=4096, description="Largest request head (request line and headers): 431 above."
    )
    body_idle_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="While a body is read, each part must arrive within this long (408 and the connection closed).",
    )
    body_min_rate_bytes_s: int = Field(
        256 * 1024,
        gt=0,
        description="A whole body must arrive within body_idle_timeout_s plus its length (or its route's bound) at "
        "this rate: 64 MiB in about 4.5 minutes (408 and the connection closed after that).",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Open connections (and requests in progress) one API process serves; a request beyond them is "
        "answered 503 with Retry-After at once, after the connections idle the longest have been closed to make "
        "room. Each slow head is closed after head_timeout_s.",
    )
    keep_alive_s: int = Field(
        120,
        ge=1,
        le=3600,
        description="A keep-alive connection idle this long after an answer is closed. Longer than the idle pools of "
        "common clients (90 s in reqwest, Go and the E2B SDK), so the client closes first: a request sent on a "
        "connection the server is closing is lost, and clients do not resend a POST.",
    )


class Settings(SettingsRoot):
    """Every setting can be given as EXECBOX_<NAME> or EXECBOX_<GROUP>__<NAME>."""

    redis: RedisSettings = RedisSettings()
    docker: DockerSettings = DockerSettings()
    queue: QueueSettings = QueueSettings()
    worker: WorkerSettings = WorkerSettings()
    pool: PoolSettings = PoolSettings()
    egress: EgressSettings = EgressSettings()
    api: ApiSettings = ApiSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    auth: AuthSettings = AuthSettings()
    webhooks: WebhookSettings = WebhookSettings()
    plans: PlanSettings = PlanSettings()
    sessions: SessionSettings = SessionSettings()
    e2b: E2bSettings = E2bSettings()
    retention_s: int = Field(24 * 3600, gt=0, description="How long finished executions are kept.")
    policies_dir: Path = Field(REPO_ROOT / "policies", description="Directory of policy YAML files.")
    artifacts: ArtifactSettings = ArtifactSettings()
    # Kept at the root so that its variable stays EXECBOX_ARTIFACTS_DIR, the name deployments use.
    artifacts_dir: Path = Field(
        REPO_ROOT / ".run" / "artifacts",
        description="Local artifact store shared by API and workers (a shared volume when they run apart); "
        "unused with EXECBOX_ARTIFACTS__STORE=s3.",
    )
    images_dir: Path = Field(REPO_ROOT / "sandbox-images", description="Directory of sandbox image metadata.")
    log_level: str = Field("INFO", description="Log level of the JSON logs.")


__all__ = ["ApiSettings", "Settings"]
