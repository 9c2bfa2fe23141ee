"""What a request asks of a policy, what an execution ran with, and the language listing."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from execbox.egress.rules import HostPattern

_STRICT = ConfigDict(extra="forbid")


class NetworkAllowlist(BaseModel):
    """Network through the egress proxy, to these hosts only."""

    model_config = _STRICT

    mode: Literal["allowlist"] = Field(description="`allowlist`: HTTP(S) through the egress proxy, nothing else.")
    allow: list[str] = Field(
        min_length=1,
        max_length=64,
        description="Host patterns: `api.example.com`, `*.pypi.org` (names under pypi.org), optionally with "
        "`:port` (without a port: 80 and 443). Each must be covered by the named policy's `network_allow`.",
    )

    @field_validator("allow")
    @classmethod
    def _patterns(cls, allow: list[str]) -> list[str]:
        return [str(HostPattern.parse(pattern)) for pattern in allow]


class PolicyRequest(BaseModel):
    """Limits asked for by the client; each is checked against the named policy's ceiling."""

    model_config = _STRICT

    name: str | None = Field(
        None, max_length=64, description="Named server policy (policies/<name>.yaml); default: `default`."
    )
    timeout_s: float | None = Field(None, gt=0, le=86400, description="Wall-clock limit of the run, seconds.")
    cpu: float | None = Field(None, gt=0, le=256, description="CPU quota in cores (fractions allowed).")
    cpu_time_s: int | None = Field(None, gt=0, le=86400, description="CPU-time limit per process, seconds.")
    memory_mb: int | None = Field(None, ge=16, le=1 << 20, description="Memory limit (swap included), MiB.")
    pids: int | None = Field(None, ge=8, le=1 << 16, description="Largest number of processes and threads.")
    disk_mb: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="Writable space (/workspace and /tmp each), MiB; also the largest file the program may write.",
    )
    output_bytes: int | None = Field(
        None,
        ge=1024,
        le=1 << 30,
        description="Cap of stdout and of stderr, bytes each; the program is stopped when one passes it.",
    )
    queue_timeout_s: float | None = Field(
        None, gt=0, le=86400, description="How long the execution may wait in the queue before it becomes `expired`."
    )
    runtime: Literal["runc", "runsc", "bwrap"] | None = Field(
        None,
        description="Runtime: `runc` (the default), `runsc` (gVisor: a second kernel boundary) or `bwrap` (fresh "
        "namespaces made by bubblewrap, no container: the fastest start; no network allowlist, no sessions); 422 "
        "when no worker offers it. The named policy may set a default.",
    )
    network: Literal["none"] | NetworkAllowlist | None = Field(
        None,
        description="Network access: `none` (the default: no interface but loopback) or "
        '`{"mode": "allowlist", "allow": [...]}` (HTTP and HTTPS to those hosts through the egress proxy).',
    )
    stdin_bytes: int | None = Field(None, ge=0, le=1 << 30, description="Largest stdin accepted, bytes.")
    input_files: int | None = Field(None, ge=0, le=100000, description="Most input files per execution.")
    input_file_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest input file, bytes.")
    input_total_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest total of input files, bytes.")
    artifact_files: int | None = Field(None, ge=0, le=100000, description="Most artifacts kept.")
    artifact_file_bytes: int | None = Field(None, ge=0, le=1 << 34, description="Largest artifact kept, bytes.")
    artifact_total_bytes: int | None = Field(
        None, ge=0, le=1 << 34, description="Largest total of artifacts kept, bytes."
    )


class AppliedPolicy(BaseModel):
    """The limits an execution actually ran with."""

    name: str = Field(description="Named policy the limits came from.")
    timeout_s: float = Field(description="Wall-clock limit, seconds.")
    cpu: float = Field(description="CPU quota, cores.")
    cpu_time_s: int = Field(description="CPU-time limit per process, seconds.")
    memory_mb: int = Field(description="Memory limit (swap included), MiB.")
    pids: int = Field(description="Process/thread limit.")
    disk_mb: int = Field(description="Writable space per scratch mount and largest file, MiB.")
    output_bytes: int = Field(description="Cap of each output stream, bytes.")
    queue_timeout_s: float = Field(description="Queue deadline, seconds after submission.")
    network: Literal["none"] | NetworkAllowlist = Field(description="Network access.")
    runtime: str | None = Field(
        None,
        description="OCI runtime (runc, runsc); set by the worker that takes the run when the request and "
        "policy left it to the operator's default.",
    )
    seccomp_deny: list[str] = Field(
        default_factory=list, description="System calls the named policy denies on top of execbox's seccomp profile."
    )
    code_bytes: int = Field(description="Largest code accepted, bytes.")
    stdin_bytes: int = Field(description="Largest stdin accepted, bytes.")
    input_files: int = Field(description="Most input files.")
    input_file_bytes: int = Field(description="Largest input file, bytes.")
    input_total_bytes: int = Field(description="Largest total of input files, bytes.")
    artifact_files: int = Field(description="Most artifacts kept.")
    artifact_file_bytes: int = Field(description="Largest artifact kept, bytes.")
    artifact_total_bytes: int = Field(description="Largest total of artifacts kept, bytes.")


class RuntimePublic(BaseModel):
    name: str = Field(description="The interpreter or compiler: CPython, Node.js, GNU bash, R.")
    version: str = Field(description="Its exact version, as the built image reports it.")


class LanguagePublic(BaseModel):
    name: str = Field(description="What to send as `language`: `python`, or `python@slim` for a variant.")
    language: str = Field(description="The language (the name without its variant).")
    variant: str | None = Field(
        description="The image variant (null: the language's default image). A variant runs only under a "
        "policy whose `variants` list allows it (422 otherwise)."
    )
    version: str = Field(description="Language version in the image (major.minor).")
    aliases: list[str] = Field(description="Other names accepted for it.")
    image: str = Field(description="Sandbox image tag.")
    file: str = Field(description="File name the code is saved as in /workspace.")
    sessions: bool = Field(description="Whether sessions (POST /v1/sessions) can run it.")
    session_contexts: list[str] = Field(
        default_factory=list,
        description="The context languages a session's cell may name in `session_context` (beside its own).",
    )
    runtime: RuntimePublic | None = Field(
        description="The runtime the built image holds (null until sandbox-images/build.sh has built it)."
    )
    packages: dict[str, str] | None = Field(
        description="Packages in the image and their versions (Python distributions, Debian packages, R "
        "packages), as the built image reports them; null until it is built."
    )


class LanguagesPublic(BaseModel):
    languages: list[LanguagePublic] = Field(description="Every language this service runs.")
