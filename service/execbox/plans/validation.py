"""Checking a plan before anything runs: every problem at once, each with its path in the request.

Feasibility (ids, references, cycles, budgets that cannot fit) and permissions (languages,
policies and their ceilings, the policies the tenant may use, for code cells, scripts, fallbacks
and compensations alike; a script's literal arguments against its input schema) are checked up
front, so a run never starts on a plan that could only fail for reasons known in advance.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from execbox.catalog.languages import Languages
from execbox.catalog.policies import PolicySet
from execbox.catalog.schemas import PolicyRequest
from execbox.core.errors import FieldProblem, ServiceError
from execbox.core.readable import schema_problems
from execbox.library.schemas import ScriptVersion
from execbox.library.service import input_problems
from execbox.plans.refs import Ref, RefError, refs_in
from execbox.plans.schemas import MAX_PLAN_STEPS, CodeCell, PlanDocument, ScriptRef, StepSpec
from execbox.plans.step_keys import collisions, template_problem


def arg_sources(step: StepSpec) -> list[tuple[str, dict[str, Any]]]:
    """Every argument object of a step with its path: its own, its preconditions', its status check's."""
    sources = [("args", step.args)] + [(f"preconditions/{i}/args", c.args) for i, c in enumerate(step.preconditions)]
    if step.idempotency is not None and step.idempotency.status_check is not None:
        sources.append(("idempotency/status_check/args", step.idempotency.status_check.args))
    if step.fallback is not None:
        sources.append(("fallback/args", step.fallback.args))
    return sources


def step_refs(step: StepSpec) -> list[Ref]:
    """The references in all of a step's arguments (malformed ones are the validation's to report)."""
    found: list[Ref] = []
    for path, args in arg_sources(step):
        try:
            found += refs_in(args, path)
        except RefError:
            pass
    return found


def dependencies(step: StepSpec) -> set[str]:
    """The steps this one waits for: those its arguments refer to, and its depends_on."""
    return {r.step for r in step_refs(step) if r.step is not None} | set(step.depends_on)


def order(steps: Iterable[StepSpec]) -> list[str]:
    """Step ids in an order where every step comes after its dependencies (the plan is acyclic)."""
    return list(graphlib.TopologicalSorter({s.id: dependencies(s) for s in steps}).static_order())


def problems(
    plan: PlanDocument,
    languages: Languages,
    policies: PolicySet,
    allowed_policies: Collection[str],
    prefix: str = "plan",
    frozen: Mapping[str, str] | None = None,
    new_ids: Collection[str] | None = None,
    dispatched: int = 0,
    scripts: Callable[[str], ScriptVersion | str] = lambda ref: "this service has no script library",
    used_keys: Mapping[str, str] | None = None,
) -> list[FieldProblem]:
    """Every problem of the plan. For a revision, `frozen` maps the steps of earlier revisions to
    their status (added steps may refer only to succeeded ones), `new_ids` names the added steps,
    `dispatched` counts the attempts the run has used of max_steps, `used_keys` holds the
    idempotency keys the run's writes used (key -> digest of their arguments) and `scripts` finds
    the script a `name@version` names (or says why it cannot)."""
    rules = _Rules(languages, policies, allowed_policies, scripts)
    found: list[FieldProblem] = []
    ids = [s.id for s in plan.steps]
    known = set(ids)
    seen: set[str] = set()
    for index, step in enumerate(plan.steps):
        at = f"{prefix}.steps.{index}"
        if step.id in seen:
            found.append(FieldProblem(f"{at}.id", f"step id {step.id!r} is used twice; every step needs its own"))
        seen.add(step.id)
        if frozen is not None and new_ids is not None and step.id not in new_ids:
            continue  # an earlier revision's step: checked when it was added
        found += _step_problems(step, at, plan, known, rules, frozen)
    keyed = [(f"{prefix}.steps.{i}.idempotency.key", s.idempotency.key, s.args) for i, s in enumerate(plan.steps)
             if s.idempotency is not None and s.idempotency.key and (new_ids is None or s.id in new_ids)]  # fmt: skip
    found += collisions(keyed, used_keys or {})
    runs = [s for s in plan.steps if s.input is None and (new_ids is None or s.id in new_ids)]
    needed = dispatched + len(runs)  # an input step dispatches nothing
    if needed > plan.budgets.max_steps:
        fits = f"{needed} steps ({dispatched} already dispatched) cannot fit in max_steps {plan.budgets.max_steps}"
        found.append(FieldProblem(f"{prefix}.budgets.max_steps", fits))
    if len(plan.steps) > MAX_PLAN_STEPS:
        total = f"the run would hold {len(plan.steps)} steps across its revisions; at most {MAX_PLAN_STEPS}"
        found.append(FieldProblem(f"{prefix}.steps" if new_ids is None else f"{prefix}.add", total))
    if plan.goal is not None and plan.goal.step not in known:
        found.append(FieldProblem(f"{prefix}.goal.step", f"no step {plan.goal.step!r}"))
    if plan.goal is not None:
        found += schema_problems(plan.goal.outputs_schema, f"{prefix}.goal.outputs_schema")
    try:
        order(s for s in plan.steps if s.id in known)
    except graphlib.CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        found.append(FieldProblem(f"{prefix}.steps", f"the steps form a cycle: {cycle}"))
    return found


@dataclass(frozen=True)
class _Rules:
    """What a plan's runs are checked against: the languages, the policies and those the tenant
    may use, and the script library."""

    languages: Languages
    policies: PolicySet
    allowed: Collection[str]
    scripts: Callable[[str], ScriptVersion | str]

    def cell(self, language: str, code: str, request: PolicyRequest, at: str, where: str) -> list[FieldProblem]:
        """Code in `language` under `request` (the run at `at.where`): the language exists, the
        policy resolves and allows it, and the tenant may use that policy."""
        try:
            known = self.languages.get(language)
            policy = self.policies.resolve(request, len(code.encode()))
            self.policies.check_language(policy.name, known.name, f"{where}.language")
        except ServiceError as exc:
            return [FieldProblem(f"{at}.{p.field}", p.message) for p in exc.problems] or [
                FieldProblem(f"{at}.{where}", exc.message)
            ]
        if policy.name in self.allowed:
            return []
        policy_at = "policy" if where == "run" else f"{where.rsplit('.', 1)[0]}.policy"
        return [FieldProblem(f"{at}.{policy_at}.name", f"this tenant may not use policy {policy.name!r}; "
                             f"allowed: {', '.join(sorted(self.allowed))}")]  # fmt: skip

    def run(
        self, what: CodeCell | ScriptRef, args: dict[str, Any], request: PolicyRequest, at: str, where: str
    ) -> list[FieldProblem]:
        """A step's (or its fallback's) run: a code cell as `cell`; a script that exists, under the
        policy it would run with, with literal arguments its input schema accepts."""
        if isinstance(what, CodeCell):
            blank = [FieldProblem(f"{at}.{where}.code", "code is blank; send the program to run")]
            return self.cell(what.language, what.code, request, at, where) + (blank if not what.code.strip() else [])
        script = self.scripts(what.script)
        if isinstance(script, str):
            return [FieldProblem(f"{at}.{where}.script", script)]
        chosen = request if request != PolicyRequest() else script.default_policy
        args_at = "args" if where == "run" else f"{where.rsplit('.', 1)[0]}.args"
        return self.cell(script.language, script.code, chosen, at, where) + _literal_problems(
            script.input_schema, args, f"{at}.{args_at}"
        )


def _literal_problems(schema: dict[str, Any], args: dict[str, Any], at: str) -> list[FieldProblem]:
    """The arguments without references checked against a script's input schema now; those with
    references are checked when the step starts (their values exist only then)."""
    literal = {}
    for name, value in args.items():
        try:
            if not any(True for _ in refs_in(value)):
                literal[name] = value
        except RefError:
            pass  # reported with the step's references
    later = set(args) - set(literal)
    relaxed = {**schema, "required": [r for r in schema.get("required", []) if r not in later]}
    return input_problems(relaxed if "required" in schema else schema, literal, at)


_INPUT_STEP_FIELDS = {"id", "input", "args", "depends_on"}


def _step_problems(
    step: StepSpec,
    at: str,
    plan: PlanDocument,
    known: set[str],
    rules: _Rules,
    frozen: Mapping[str, str] | None,
) -> list[FieldProblem]:
    found: list[FieldProblem] = []
    if step.input is not None:
        found += [FieldProblem(f"{at}.{name}", "an input step takes only id, input, args and depends_on")
                  for name in sorted(step.model_fields_set - _INPUT_STEP_FIELDS)]  # fmt: skip
        found += schema_problems(step.input.value_schema, f"{at}.input.schema")
        found += [FieldProblem(f"{at}.{r.path.replace('/', '.')}", "an input step's context is values: refer to "
                               "outputs with $ref, not to files with $artifact") for r in step_refs(step)
                  if r.kind == "artifact"]  # fmt: skip
    else:
        assert step.run is not None
        found += rules.run(step.run, step.args, step.policy, at, "run")
    if step.fallback is not None and step.compensation is not None:
        found.append(FieldProblem(f"{at}.fallback", "a step with a compensation takes no fallback: the compensation "
                                  "undoes the step's own write, not another"))  # fmt: skip
    if step.fallback is not None:
        fallback_policy = step.fallback.policy or step.policy
        found += rules.run(step.fallback.run, step.fallback.args, fallback_policy, at, "fallback.run")
    found += _schema_problems(step, at)
    cells = [(f"preconditions.{i}.run", c.run) for i, c in enumerate(step.preconditions)]
    if step.idempotency is not None and step.idempotency.status_check is not None:
        cells.append(("idempotency.status_check.run", step.idempotency.status_check.run))
    if step.compensation is not None:
        cells.append(("compensation.run", step.compensation.run))
    for where, cell in cells:  # an execution refuses blank code: refused here, not when it would run
        if isinstance(cell, CodeCell) and not cell.code.strip():
            found.append(FieldProblem(f"{at}.{where}.code", "code is blank; send the program to run"))
    if step.effect == "write" and step.idempotency is None:
        found.append(FieldProblem(f"{at}.idempotency", "a write step must declare how it may be repeated: "
                                  "strategy key, status_read, compensation or none"))  # fmt: skip
    template = step.idempotency.key if step.idempotency is not None else None
    if template is not None and (problem := template_problem(template, step.args)):
        found.append(FieldProblem(f"{at}.idempotency.key", problem))
    if step.idempotency is not None and (step.idempotency.strategy == "status_read") != bool(
        step.idempotency.status_check
    ):
        found.append(FieldProblem(f"{at}.idempotency.status_check", "give a status_check with strategy "
                                  "status_read (and only then)"))  # fmt: skip
    refs: list[Ref] = []
    for path, args in arg_sources(step):
        try:
            refs += refs_in(args, path)
        except RefError as exc:
            found.append(FieldProblem(f"{at}.{exc.path.replace('/', '.')}", exc.message))
    for ref in refs:
        where = f"{at}.{ref.path.replace('/', '.')}"
        if ref.pointer[0] == "inputs":
            if len(ref.pointer) > 1 and ref.pointer[1] not in plan.inputs:
                found.append(FieldProblem(where, f"the plan has no input {ref.pointer[1]!r}"))
        elif ref.step not in known:
            found.append(FieldProblem(where, f"no step {ref.step!r}"))
        elif ref.step == step.id:
            found.append(FieldProblem(where, "a step cannot refer to itself"))
        elif frozen is not None and ref.step in frozen and frozen[ref.step] != "succeeded":
            found.append(FieldProblem(where, f"step {ref.step!r} is {frozen[ref.step]}; refer only to succeeded "
                                      "steps or to steps of this revision"))  # fmt: skip
    for index, dependency in enumerate(step.depends_on):
        if dependency not in known:
            found.append(FieldProblem(f"{at}.depends_on.{index}", f"no step {dependency!r}"))
    return found + _compensation_problems(step, at, rules)


def _compensation_problems(step: StepSpec, at: str, rules: _Rules) -> list[FieldProblem]:
    """A compensation undoes a write: its code must run under the tenant's policies, and its
    arguments may refer to the run's inputs, the step's own outputs and the steps it depends on."""
    found: list[FieldProblem] = []
    strategy = step.idempotency.strategy if step.idempotency is not None else None
    if strategy == "compensation" and step.compensation is None:
        found.append(FieldProblem(f"{at}.compensation", "strategy compensation needs the compensation that undoes it"))
    if step.compensation is None:
        return found
    if step.effect != "write":
        found.append(FieldProblem(f"{at}.compensation", "a compensation undoes a write: give `effect: write`"))
    cell = step.compensation
    found += rules.cell(cell.run.language, cell.run.code, cell.policy or step.policy, at, "compensation.run")
    allowed = dependencies(step) | {step.id}
    try:
        refs = list(refs_in(cell.args, "compensation/args"))
    except RefError as exc:
        return [*found, FieldProblem(f"{at}.{exc.path.replace('/', '.')}", exc.message)]
    for ref in refs:
        if ref.kind == "artifact" or (ref.step is not None and ref.step not in allowed):
            where = f"{at}.{ref.path.replace('/', '.')}"
            found.append(FieldProblem(where, "a compensation may refer to the run's inputs, its step's outputs and "
                                             "the steps it depends on (no artifacts)"))  # fmt: skip
    return found


def _schema_problems(step: StepSpec, at: str) -> list[FieldProblem]:
    """Every JSON Schema the step keeps, compiled now: one that cannot compile would otherwise fail
    only when the step ends, on every reconciliation of the run."""
    found: list[FieldProblem] = []
    if step.postconditions is not None and step.postconditions.outputs_schema is not None:
        found += schema_problems(step.postconditions.outputs_schema, f"{at}.postconditions.outputs_schema")
    for index, check in enumerate(step.preconditions):
        found += schema_problems(check.expect, f"{at}.preconditions.{index}.expect")
    if step.idempotency is not None and step.idempotency.status_check is not None:
        found += schema_problems(step.idempotency.status_check.expect, f"{at}.idempotency.status_check.expect")
    return found
