"""Server-side policies: load policies/*.yaml at start-up and resolve a request's limits.

Precedence: default.yaml < the named policy < the request. A request above a ceiling is refused
(PolicyExceeded names the field and the ceiling); nothing is clamped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from execbox.catalog.errors import PolicyExceeded, UnknownPolicy, VariantNotAllowed
from execbox.catalog.schemas import AppliedPolicy, NetworkAllowlist, PolicyRequest
from execbox.core.errors import FieldProblem
from execbox.core.yamltext import YAMLError, safe_load
from execbox.egress.rules import HostPattern, uncovered

DEFAULT_POLICY = "default"
NOT_POLICIES = {"tenants.yaml"}  # per-tenant quotas live next to the policies (execbox.tenancy.quotas)


class _Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(None, gt=0)
    cpu: float | None = Field(None, gt=0)
    cpu_time_s: int | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, ge=16)
    pids: int | None = Field(None, ge=8)
    disk_mb: int | None = Field(None, ge=1)
    output_bytes: int | None = Field(None, ge=1024)
    queue_timeout_s: float | None = Field(None, gt=0)
    code_bytes: int | None = Field(None, ge=1)
    stdin_bytes: int | None = Field(None, ge=0)
    input_files: int | None = Field(None, ge=0)
    input_file_bytes: int | None = Field(None, ge=0)
    input_total_bytes: int | None = Field(None, ge=0)
    artifact_files: int | None = Field(None, ge=0)
    artifact_file_bytes: int | None = Field(None, ge=0)
    artifact_total_bytes: int | None = Field(None, ge=0)


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: _Limits = _Limits()
    ceilings: _Limits = _Limits()
    network_allow: list[str] | None = None
    """Host patterns a request under this policy may put in its network allowlist (none: no network)."""
    runtime: Literal["runc", "runsc"] | None = None
    """The runtime of runs that ask for none."""
    seccomp_deny: list[str] | None = None
    """System calls denied on top of execbox's profile (a policy can narrow it, never widen it)."""
    variants: list[str] | None = None
    """Image variants a request under this policy may select: `python@slim`, or `python@*` for all."""

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, variants: list[str] | None) -> list[str] | None:
        for name in variants or ():
            base, mark, variant = name.partition("@")
            if not (base and mark and variant):
                raise ValueError(f"{name!r} is not language@variant (or language@*)")
        return variants

    @field_validator("network_allow")
    @classmethod
    def _patterns(cls, allow: list[str] | None) -> list[str] | None:
        return None if allow is None else [str(HostPattern.parse(pattern)) for pattern in allow]


LIMIT_FIELDS: tuple[str, ...] = tuple(_Limits.model_fields)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class PolicyConfigError(Exception):
    """policies/ is unusable; the process must not start."""


@dataclass(frozen=True)
class Policy:
    name: str
    defaults: dict[str, float]
    ceilings: dict[str, float]
    network_allow: tuple[str, ...] = ()
    runtime: str | None = None
    seccomp_deny: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()

    def allows(self, language: str) -> bool:
        """Whether a request under this policy may run `language` (a variant only when listed)."""
        base, _, variant = language.partition("@")
        return not variant or language in self.variants or f"{base}@*" in self.variants


def _read(path: Path) -> _PolicyFile:
    try:
        raw: Any = safe_load(path.read_text()) or {}
        return _PolicyFile.model_validate(raw)
    except (OSError, YAMLError, ValidationError) as exc:
        raise PolicyConfigError(f"{path}: {exc}") from exc


class PolicySet:
    """All named policies, validated once."""

    def __init__(self, policies: dict[str, Policy]) -> None:
        self._policies = policies

    @classmethod
    def load(cls, directory: Path) -> PolicySet:
        base_path = directory / f"{DEFAULT_POLICY}.yaml"
        if not base_path.is_file():
            raise PolicyConfigError(f"{base_path} is missing; it defines every default and ceiling")
        base = _read(base_path)
        policies: dict[str, Policy] = {}
        for path in sorted(p for p in directory.glob("*.yaml") if p.name not in NOT_POLICIES):
            layer = base if path == base_path else _read(path)
            defaults = base.defaults.model_dump() | layer.defaults.model_dump(exclude_none=True)
            ceilings = base.ceilings.model_dump() | layer.ceilings.model_dump(exclude_none=True)
            for name in LIMIT_FIELDS:
                if defaults[name] is None or ceilings[name] is None:
                    raise PolicyConfigError(f"{base_path}: defaults and ceilings must both give {name}")
                if defaults[name] > ceilings[name]:
                    raise PolicyConfigError(f"{path}: default {name}={defaults[name]} is above its ceiling")
            allow = layer.network_allow if layer.network_allow is not None else base.network_allow
            runtime = layer.runtime or base.runtime
            deny = sorted({*(base.seccomp_deny or ()), *(layer.seccomp_deny or ())})  # narrowing adds up
            variants = layer.variants if layer.variants is not None else base.variants
            policies[path.stem] = Policy(
                path.stem, defaults, ceilings, tuple(allow or ()), runtime, tuple(deny), tuple(variants or ())
            )
        return cls(policies)

    def max_ceiling(self, field: str) -> int:
        """The highest ceiling of a limit over every policy (bounds parsing before a policy is known)."""
        return int(max(p.ceilings[field] for p in self._policies.values()))

    def highest_ceiling(self, field: str) -> float:
        """The highest ceiling of a limit over every policy, as written (`cpu` may be fractional):
        the most any sandbox of this deployment may be given (the docker proxy's bounds)."""
        return max(p.ceilings[field] for p in self._policies.values())

    def seccomp_denies(self) -> set[tuple[str, ...]]:
        """Each policy's narrowing of the seccomp profile: the profiles a sandbox may carry."""
        return {p.seccomp_deny for p in self._policies.values()}

    @property
    def names(self) -> list[str]:
        return sorted(self._policies)

    def check_language(self, policy: str, language: str, field: str = "language") -> None:
        """Refuse (422, naming `field`) a variant the named policy does not allow."""
        found = self._policies.get(policy)
        if found is not None and not found.allows(language):
            raise VariantNotAllowed(language, policy, list(found.variants), field)

    def resolve(self, request: PolicyRequest, code_bytes: int) -> AppliedPolicy:
        name = request.name or DEFAULT_POLICY
        policy = self._policies.get(name)
        if policy is None:
            raise UnknownPolicy(name, self.names)
        asked = request.model_dump(exclude_none=True, exclude={"name", "network", "runtime"})
        problems = [
            FieldProblem(
                f"policy.{field}",
                f"{_num(value)} is above the ceiling {_num(policy.ceilings[field])} of policy {name!r}; "
                f"ask for at most {_num(policy.ceilings[field])} or use a policy with a higher ceiling",
            )
            for field, value in asked.items()
            if value > policy.ceilings[field]
        ]
        if code_bytes > policy.ceilings["code_bytes"]:
            problems.append(
                FieldProblem(
                    "code",
                    f"{code_bytes} bytes is above the ceiling {_num(policy.ceilings['code_bytes'])} of policy "
                    f"{name!r}; send a smaller program",
                )
            )
        network = request.network or "none"
        if isinstance(network, NetworkAllowlist):
            allowed = ", ".join(policy.network_allow) or "none"
            problems += [
                FieldProblem(
                    f"policy.network.allow.{i}",
                    f"{network.allow[i]!r} is not a host policy {name!r} lets executions reach (it allows: "
                    f"{allowed}); ask the operator to add it to policies/{name}.yaml `network_allow`",
                )
                for i in uncovered(network.allow, list(policy.network_allow))
            ]
        if problems:
            raise PolicyExceeded(tuple(problems))
        values = policy.defaults | asked | {"code_bytes": policy.ceilings["code_bytes"]}
        runtime = request.runtime or policy.runtime
        return AppliedPolicy.model_validate(
            {**values, "name": name, "network": network, "runtime": runtime, "seccomp_deny": list(policy.seccomp_deny)}
        )


def runtime_problems(policy: AppliedPolicy, available: set[str] | None, network_runtime: str) -> list[FieldProblem]:
    """Why the policy's runtime cannot run here: no live worker's engine has it (`available` is the
    union of what live workers report; None when none reports, so nothing can be said yet)."""
    wanted = policy.runtime
    if wanted in (None, "runc") or available is None:
        return []
    if wanted not in available:
        return [FieldProblem("policy.runtime", f"no worker of this deployment has the runtime {wanted!r} (they have: "
                             f"{', '.join(sorted(available)) or 'none'}); install it (`make engine` registers runsc) "
                             "or leave policy.runtime out")]  # fmt: skip
    if wanted == "bwrap" and isinstance(policy.network, NetworkAllowlist):
        return [FieldProblem("policy.network", "the bwrap runtime runs without a network; a network allowlist needs "
                             "runc or runsc (leave policy.runtime out)")]  # fmt: skip
    if wanted == "runsc" and isinstance(policy.network, NetworkAllowlist) and network_runtime not in available:
        return [FieldProblem("policy.network", f"network allowlists under runsc need the engine runtime "
                             f"{network_runtime!r} (gVisor with the run's network namespace passed through), which "
                             "no worker has; use runc for this run or register it (docs/security.md)")]  # fmt: skip
    return []
