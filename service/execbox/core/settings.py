"""Service configuration: one Settings object, built once by each entry point."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_REPO_ROOT = Path(__file__).resolve().parents[3]


class RedisSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="Redis DSN shared by API and workers.")
    socket_timeout_s: float = Field(5.0, gt=0, description="Timeout of every Redis command but blocking waits.")
    key_prefix: str = Field("execbox", description="Prefix of every key execbox writes.")


class DockerSettings(BaseModel):
    url: str | None = Field(
        None, description="Docker engine URL; unset means the DOCKER_HOST environment or the socket."
    )
    api_timeout_s: float = Field(30.0, gt=0, description="Timeout of each Docker API call.")
    runtime: str | None = Field(
        None, description="OCI runtime for sandboxes whose policy names none, e.g. runsc (gVisor); unset: runc."
    )
    offered_runtimes: list[str] | None = Field(
        None,
        description='Runtimes this worker offers to policy.runtime, e.g. ["runc"]; unset: every runtime its engine '
        "has registered. Workers report them; the API refuses a runtime no live worker offers (422).",
    )
    runsc_network_runtime: str = Field(
        "runsc-net",
        description="The engine's name for gVisor with the run's network namespace passed through (runsc "
        "--network=host), used for allowlisted runs under policy.runtime runsc; `runsc` itself has no network.",
    )
    seccomp_profile: Path | None = Field(
        None, description="execbox's seccomp profile for every sandbox; unset: seccomp.json in the policies directory."
    )
    uid_range: str = Field(
        "200000-299999",
        description="Host uids given to sandboxes, one per live sandbox (FIRST-LAST); must belong to no one.",
    )
    oom_score_adj: int = Field(
        1000, ge=-1000, le=1000, description="OOM score adjustment of sandboxes (1000: the host kills them first)."
    )


class QueueSettings(BaseModel):
    name: str = Field("execbox", description="RQ queue the API enqueues to and workers listen on.")
    setup_margin_s: int = Field(60, ge=5, description="RQ job timeout = run timeout + this margin (last resort only).")
    max_depth: int = Field(10000, ge=1, description="Executions the queue may hold; above it POST answers 503.")


class WorkerSettings(BaseModel):
    lease_s: float = Field(
        10.0,
        gt=0,
        description="A running execution whose worker stopped renewing its lease "
        "for this long is declared lost (sandbox.error, retryable).",
    )
    reaper_interval_s: float = Field(
        15.0,
        gt=0,
        description="How often each worker sweeps for lost executions, expired queue entries and orphaned containers.",
    )
    orphan_grace_s: float = Field(
        30.0,
        ge=0,
        description="An execbox container that no live worker holds a lease for is removed by the "
        "reaper once it is older than this.",
    )


class PoolClassSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: str = Field(description='A language or variant, e.g. "python" or "python@slim".')
    policy: str = Field("default", description="The named policy whose limits the class's containers carry.")
    min: int = Field(1, ge=0, description="Warm containers kept however quiet the class is.")
    max: int = Field(4, ge=0, description="Warm containers kept however busy it is.")

    @model_validator(mode="after")
    def _bounds(self) -> PoolClassSettings:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min}); make max at least min")
        return self


class PoolSettings(BaseModel):
    classes: list[PoolClassSettings] = Field(
        default_factory=list,
        description='Warm-pool classes, e.g. [{"language": "python", "min": 1, "max": 4}, {"language": '
        '"python@slim", "policy": "large", "min": 0, "max": 2}]: each worker keeps between min and max '
        "started containers of that language with that policy's limits, as many as the class's arrivals "
        "of the last `window_s` ask for (the most that came within one refill time). Runs whose image, disk, "
        "CPU time and pids match a class take one. Empty (and no `sizes`): no pool.",
    )
    sizes: dict[str, int] = Field(
        default_factory=dict,
        description='Shorthand for fixed-size classes of the default policy, e.g. {"python": 2} (min = max = 2). '
        "An idle python container holds about 57 MiB with its preloaded modules, 5 MiB without.",
    )
    window_s: float = Field(60.0, gt=0, description="How far back a class's arrivals count toward its size.")
    refill_parallelism: int = Field(2, ge=1, le=16, description="Warm containers a worker creates at once.")
    refill_during_runs: bool = Field(
        False,
        description="Refill while one of the worker's runs is in progress; by default refills wait for the run "
        "to end and its result to be stored, so that the engine's work never competes with a run.",
    )
    memory_budget_mb: int = Field(
        2048,
        ge=0,
        description="Memory the warm containers on one engine (every worker of the deployment on that host) may "
        "hold, each counted at its class's memory limit (the most it can hold once a run takes it); classes keep "
        "their min, and what is above it is granted while the budget lasts. A worker learns what the others hold "
        "every few seconds (from the containers' labels).",
    )
    max_idle_s: float = Field(600.0, gt=0, description="A warm container that waited this long is replaced.")
    preload: bool = Field(
        True,
        description="Warm containers of a language whose metadata has `preload` start its interpreter and "
        'import its modules before any code arrives (docs/operations.md, "Warm pool").',
    )

    def all_classes(self) -> list[PoolClassSettings]:
        """`classes`, then `sizes` as fixed-size classes of the default policy."""
        fixed = [PoolClassSettings(language=name, min=n, max=n) for name, n in self.sizes.items()]
        return [*self.classes, *fixed]


class EgressSettings(BaseModel):
    port: int = Field(3128, ge=1, le=65535, description="Port the egress proxy listens on (in its container).")
    container: str = Field(
        "execbox-egress",
        description="Name or id of the egress proxy's container, which workers attach to each allowlisted "
        "execution's network.",
    )
    subnet_pool: str = Field(
        "10.213.0.0/16", description="Address range the per-execution networks (/28 each) are carved from."
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=120, description="Timeout of the proxy's upstream connects.")
    idle_timeout_s: float = Field(60.0, gt=0, description="A proxied connection idle this long is closed.")
    max_connections: int = Field(64, ge=1, description="Connections one execution may open through the proxy.")
    max_bytes: int = Field(104857600, ge=1024, description="Bytes (both directions) one execution may move.")
    slot_cooldown_s: float = Field(
        30.0,
        ge=0,
        description="A per-execution network slot (/28) stays unused this long after its run's network is "
        "removed, so nothing keyed by the proxy's address on it can ever be served to the next run.",
    )
    public_key: str | None = Field(
        None,
        description="The egress proxy's public key (base64), with which `execbox secrets set` seals secret "
        "headers; `make up` generates the pair.",
    )
    private_key_file: Path | None = Field(
        None,
        description="The egress proxy's private key file (only the proxy's container has it); unset: the proxy "
        "adds no secret headers and refuses requests that need one.",
    )
    allow_private_cidrs: list[str] = Field(
        default_factory=list,
        description="Private, loopback or link-local ranges upstreams may resolve to (default: none, so an "
        "allowlisted name can never lead to an internal service or the metadata address).",
    )


class WebhookSettings(BaseModel):
    allow_hosts: list[str] = Field(
        default_factory=list,
        description='Host patterns (fnmatch) callbacks may target, e.g. ["hooks.example.com", "*.corp"]. '
        "Empty: webhooks are refused (422), so a callback can never reach an internal service by default.",
    )
    max_attempts: int = Field(5, ge=1, le=20, description="Tries per delivery before giving up.")
    backoff_s: float = Field(1.0, gt=0, description="First retry delay; doubles each try, plus up to 50% jitter.")
    timeout_s: float = Field(10.0, gt=0, description="Timeout of each delivery request.")
    claim_idle_s: float = Field(
        30.0,
        gt=0,
        description="A delivery a consumer took and never acknowledged (it died) is taken over by another "
        "worker after this long.",
    )


class PlanSettings(BaseModel):
    claim_idle_s: float = Field(
        30.0,
        gt=0,
        description="An execution event an API process took for the plan executor and never acknowledged (it "
        "died) is taken over by another after this long.",
    )


class SessionSettings(BaseModel):
    per_worker: int = Field(4, ge=0, description="Sessions one worker process holds at once (0: it holds none).")
    max_idle_timeout_s: int = Field(
        3600, ge=1, description="The longest idle_timeout_s a session may ask for (422 above)."
    )
    max_lifetime_s: int = Field(
        86400, ge=1, description="The longest max_lifetime_s a session may ask for (422 above)."
    )
    start_timeout_s: float = Field(
        120.0, gt=0, description="A session no worker has started this long after creation ends as sandbox_error."
    )


class AuthSettings(BaseModel):
    enabled: bool = Field(
        True,
        description="Require an API key on every /v1 request. Turn off only for local "
        "development: every request is then tenant `default`.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for /v1/admin (key management). Unset: "
        "the admin endpoints answer 404; use `execbox keys`.",
    )


class TelemetrySettings(BaseModel):
    worker_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of this worker process's /metrics (unset: not served)."
    )
    worker_metrics_host: str = Field("127.0.0.1", description="Address the worker's /metrics listens on.")
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces). Unset: no spans are "
        "exported and nothing leaves the host.",
    )


class ApiSettings(BaseModel):
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
        description="Largest body of every other route (plans, runs, schedules...; 413 above). Decoding JSON holds "
        "the interpreter lock (about 30 ms per MiB at worst), so this also bounds how long one body can delay others.",
    )
    sse_keepalive_s: float = Field(
        15.0, gt=0, le=300, description="A live-event stream (SSE) sends a keepalive comment after this long quiet."
    )


class Settings(BaseSettings):
    """Every setting can be given as EXECBOX_<NAME> or EXECBOX_<GROUP>__<NAME>."""

    model_config = SettingsConfigDict(env_prefix="EXECBOX_", env_nested_delimiter="__", extra="forbid")

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
    retention_s: int = Field(24 * 3600, gt=0, description="How long finished executions are kept.")
    policies_dir: Path = Field(_REPO_ROOT / "policies", description="Directory of policy YAML files.")
    artifacts_dir: Path = Field(
        _REPO_ROOT / ".run" / "artifacts",
        description="Local artifact store shared by API and workers (a shared volume when they run apart).",
    )
    images_dir: Path = Field(_REPO_ROOT / "sandbox-images", description="Directory of sandbox image metadata.")
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
