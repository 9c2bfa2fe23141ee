"""The sandbox's settings sections: the Docker engine (`EXECBOX_DOCKER__*`) and the warm pool (`EXECBOX_POOL__*`).

Plain pydantic models, no docker import: the settings root (`execbox.settings`) assembles them for every
process, the API's included (pyproject's import-linter contract ignores exactly that edge).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    bwrap_socket: str | None = Field(
        None,
        description="The unix socket of this host's bubblewrap helper (`execbox bwrap-helper`, run as root): set, "
        "the worker offers policy.runtime `bwrap` (fresh namespaces per run, no container); unset: it does not.",
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


__all__ = ["DockerSettings", "PoolClassSettings", "PoolSettings"]
