"""The script library: register immutable versions, find them, promote them on evidence, and
invoke them as ordinary executions (inputs checked against the input schema, declared outputs
against the output schema, the version recorded in the execution's `origin`, which only the
service sets).

A tenant changes the status of its own versions only; the operator's shared ones change through
the admin API. Evidence for `proven` is an execution the service itself ran for that exact version
(its origin names the version and its digest), never a label a client could set."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.core.readable import schema_problems
from execbox.core.schemacheck import schema_errors
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, Expect, InputFile, Origin
from execbox.executions.status import ExecutionStatus
from execbox.executions.submit import Submission, Submissions, request_digest
from execbox.library.errors import ScriptNotFound, VersionConflict
from execbox.library.schemas import (
    VERSION_PATTERN,
    Promote,
    ScriptCreate,
    ScriptDetail,
    ScriptSummary,
    ScriptVersion,
    VersionStatus,
    VersionView,
)
from execbox.library.store import ScriptStore
from execbox.tenancy.budget import FOREVER_S

SHARED = "*"
"""The owner of the operator's shared scripts: every tenant may find and invoke them."""


def version_key(version: str) -> tuple[Any, ...]:
    """Semantic-version order: numbers numerically, a pre-release before its release."""
    core, _, pre = version.partition("-")
    return (*(int(p) for p in core.split(".")), pre == "", pre)


def input_problems(schema: dict[str, Any], inputs: Any, prefix: str = "inputs") -> list[FieldProblem]:
    """Every violation of the input schema, each with its path."""
    found = []
    for error in sorted(schema_errors(schema, inputs), key=lambda e: [str(p) for p in e.absolute_path]):
        path = ".".join(str(p) for p in (prefix, *error.absolute_path))
        found.append(FieldProblem(path, error.message))
    return found


class ScriptRun(ExecutionCreate):
    """The execution of a script version, with the link the service records on it. No route takes
    this model: the link comes from the library, never from a body."""

    origin: Origin = Field(exclude=True, description="The version it runs (see Library.link).")


def ran(script: ScriptVersion, record: ExecutionRecord) -> bool:
    """The service ran this exact version in `record`: its origin (set only by the service) names
    the version and its digest, the code is the version's, and the execution is the owner's (any
    tenant's, for a shared script)."""
    origin = record.origin
    if origin is None or origin.script != f"{script.name}@{script.version}" or record.code != script.code:
        return False
    owner = origin.shared_script if script.tenant == SHARED else record.tenant == script.tenant
    return owner and origin.script_sha256 == script.sha256


@dataclass(frozen=True)
class Library:
    store: ScriptStore
    submissions: Submissions
    languages: Languages
    policies: PolicySet

    def register(self, tenant: str, body: ScriptCreate, allowed: Collection[str]) -> tuple[ScriptVersion, bool]:
        """(the version, created): the same registration again is a replay; other content under the
        same version is a 409 (versions are immutable)."""
        self.languages.get(body.language)
        # Compiled now, not at the first invocation: a $ref that does not resolve would otherwise be
        # stored and fail every run of the version (and every check of its outputs) afterwards.
        problems = [
            *schema_problems(body.input_schema, "input_schema"),
            *schema_problems(body.output_schema, "output_schema"),
        ]
        if problems:
            raise InvalidRequest("a schema of the script cannot be used; nothing was registered", tuple(problems))
        policy = self.policies.resolve(body.default_policy, len(body.code.encode()))
        if policy.name not in allowed:
            problem = FieldProblem("default_policy.name", f"one of {', '.join(sorted(allowed))}")
            raise InvalidRequest(f"this tenant may not use policy {policy.name!r}", (problem,))
        digest = request_digest(body)
        wanted = ScriptVersion(**body.model_dump(), sha256=digest, created_at=time.time(), tenant=tenant)
        stored = self.store.get(tenant, body.name, body.version)
        if stored is None:  # a new version is kept until removed: counted against the storage budget
            quotas = self.submissions.quotas
            charge = quotas.keep(tenant, len(wanted.model_dump_json()), FOREVER_S, "this script version")
            stored = self.store.add(wanted)
            if stored.created_at != wanted.created_at:  # registered meanwhile: counted by that registration
                quotas.budget.settle(tenant, [(charge.bucket, -charge.bytes)])
        if stored.sha256 != digest:
            raise VersionConflict(f"{body.name}@{body.version} is registered with other content; versions are "
                              "immutable: register a new version")  # fmt: skip
        return stored, stored.created_at == wanted.created_at

    def _owner(self, tenant: str, name: str) -> str:
        """The tenant's own script of that name, else the operator's shared one."""
        return tenant if tenant == SHARED or self.store.versions(tenant, name) else SHARED

    def search(self, tenant: str, q: str = "", tag: str = "") -> list[ScriptSummary]:
        found = []
        names = dict.fromkeys([*self.store.names(tenant), *self.store.names(SHARED)])
        for name in names:
            owner = self._owner(tenant, name)
            versions = sorted(self.store.versions(owner, name), key=lambda v: version_key(v.version))
            latest = versions[-1]
            text = f"{name} {latest.description} {' '.join(latest.tags)}".lower()
            if (q and q.lower() not in text) or (tag and tag not in latest.tags):
                continue
            proven = [v for v in versions if v.status is VersionStatus.PROVEN]
            found.append(ScriptSummary(
                name=name, description=latest.description, tags=latest.tags, latest=latest.version,
                proven=proven[-1].version if proven else None, input_schema=latest.input_schema,
                output_schema=latest.output_schema, shared=owner == SHARED,
            ))  # fmt: skip
        return found

    def detail(self, tenant: str, name: str) -> ScriptDetail:
        owner = self._owner(tenant, name)
        versions = sorted(self.store.versions(owner, name), key=lambda v: version_key(v.version))
        if not versions:
            raise ScriptNotFound(name)
        uses = self.store.uses(owner, name)
        return ScriptDetail(name=name, versions=[
            VersionView(version=v.version, status=v.status, sha256=v.sha256, created_at=v.created_at,
                        evidence=v.evidence, uses=uses.get(v.version, 0)) for v in versions])  # fmt: skip

    def resolve(self, tenant: str, name: str, version: str) -> ScriptVersion:
        """An exact version, or `proven`: the newest proven one (the tenant's own script of that
        name, else the operator's shared one)."""
        versions = self.store.versions(self._owner(tenant, name), name)
        if version == "proven":
            proven = [v for v in versions if v.status is VersionStatus.PROVEN]
            if not proven:
                raise ScriptNotFound(f"{name}@proven (no version of {name} is proven yet)")
            return max(proven, key=lambda v: version_key(v.version))
        found = next((v for v in versions if v.version == version), None)
        if found is None:
            raise ScriptNotFound(f"{name}@{version}")
        return found

    def checked(self, tenant: str, ref: str, inputs: Any) -> ScriptVersion:
        """The script `name@version` (or `name@proven`) names, once `inputs` satisfy its input
        schema; InvalidRequest listing every violation otherwise."""
        name, _, version = ref.partition("@")
        script = self.resolve(tenant, name, version)
        problems = input_problems(script.input_schema, inputs)
        if problems:
            raise InvalidRequest(f"the inputs do not match {name}@{script.version}'s input schema", tuple(problems))
        return script

    def promote(self, owner: str, name: str, version: str, body: Promote) -> ScriptVersion:
        """Change the status of one of `owner`'s versions: a tenant's own (a name it does not own is
        not found, even when a shared script has it), or SHARED's, which only the admin API passes."""
        script = next((v for v in self.store.versions(owner, name) if v.version == version), None)
        if script is None:
            shared = owner != SHARED and any(v.version == version for v in self.store.versions(SHARED, name))
            hint = " (the shared script of that name is the operator's: only the operator changes its status)"
            raise ScriptNotFound(f"{name}@{version} of this tenant" + (hint if shared else ""))
        if body.status == "proven":
            problems = self._evidence_problems(script, body.evidence)
            if problems:
                raise InvalidRequest(f"{name}@{version} cannot be proven on this evidence", tuple(problems))
            script.evidence = sorted({*script.evidence, *body.evidence})
        script.status = VersionStatus(body.status)
        self.store.put(script)
        return script

    def _evidence_problems(self, script: ScriptVersion, evidence: list[str]) -> list[FieldProblem]:
        label = f"{script.name}@{script.version}"
        problems = []
        for index, execution_id in enumerate(evidence):
            record = self.submissions.store.get(execution_id)
            if record is None or not ran(script, record):
                problems.append(FieldProblem(f"evidence.{index}", f"not an execution the service ran for {label} "
                                             "(an invocation, a schedule's firing or a plan step of it)"))  # fmt: skip
            elif record.status is not ExecutionStatus.SUCCEEDED:
                problems.append(FieldProblem(f"evidence.{index}", f"{execution_id} {record.status.value}"))
        if not evidence:
            problems.append(FieldProblem("evidence", "proven needs at least one succeeded execution of it"))
        return problems

    def invoke(
        self,
        tenant: str,
        name: str,
        version: str,
        inputs: dict[str, Any],
        files: list[InputFile],
        labels: dict[str, str] | None = None,
        traceparent: str | None = None,
        idempotency_key: str | None = None,
        origin: Origin | None = None,
    ) -> Submission:
        """An execution of the version: inputs checked first (422 listing every violation). `origin`
        adds what else started it (the scheduler's schedule and slot) to the script's link."""
        script = self.checked(tenant, f"{name}@{version}", inputs)
        body = self.request(script, inputs, files, labels)
        link = body.origin.model_copy(update=(origin or Origin()).model_dump(exclude_unset=True))
        submitted = self.submissions.submit(tenant, body, (), traceparent, idempotency_key=idempotency_key,
                                            route=f"invoke {name}", origin=link)  # fmt: skip
        self.store.count_use(script.tenant, name, script.version)
        return submitted

    @staticmethod
    def link(script: ScriptVersion) -> Origin:
        """The origin of an execution of the version."""
        return Origin(script=f"{script.name}@{script.version}", script_sha256=script.sha256,
                      shared_script=script.tenant == SHARED)  # fmt: skip

    @staticmethod
    def request(
        script: ScriptVersion, inputs: Any, files: list[InputFile], labels: dict[str, str] | None = None
    ) -> ScriptRun:
        """The execution of a script version (its outputs checked against its output schema);
        InvalidRequest naming each field the execution would refuse (labels stored on an older
        schedule, say), never a bare validation error."""
        try:
            return ScriptRun(
                language=script.language, code=script.code, inputs=inputs, files=files, policy=script.default_policy,
                labels=labels or {}, origin=Library.link(script),
                expect=Expect(outputs_schema=script.output_schema) if script.output_schema else None,
            )  # fmt: skip
        except ValidationError as exc:
            problems = tuple(
                FieldProblem(".".join(str(p) for p in e["loc"] if p != "[key]"), e["msg"]) for e in exc.errors()
            )
            listed = "; ".join(f"{p.field}: {p.message}" for p in problems)
            raise InvalidRequest(f"{script.name}@{script.version} cannot run with these values: {listed}",
                                 problems) from exc  # fmt: skip


__all__ = ["SHARED", "VERSION_PATTERN", "Library", "ScriptRun", "input_problems", "ran", "version_key"]
