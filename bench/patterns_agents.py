"""The scripted agents of bench/patterns.py: one runner per pattern, each driving the real service.

The model is scripted: it writes the text a model would write (thoughts, code, plans, revisions,
JSON calls, answers) from templates and branches only on what the service answered and on the
task's seeded assumptions (patterns_world.World). Every model call records its prompt and
completion token counts and the prompt's cacheable prefix; no time is slept for it (its latency is
computed from a profile afterwards, bench/patterns_sweep.py). Sandbox time is the measured wall
time of the client's calls to the service. A person's approval is decided at once by the harness;
the person's seeded delay is added as computed wait (`human_ms`), never slept.

Longer than 400 lines because the five patterns over four families share their helpers (the
service calls, the approval loop, the re-plan bookkeeping) and read best side by side.
"""

from __future__ import annotations

import ast
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from execbox_client import Client
from execbox_client.client import TERMINAL

from agent import check_details, count_tokens, fill
from patterns_world import APPROVAL_UNITS, BUY_SCRIPT, RATES, STEP_SCRIPTS, SYSTEM, TOOL_POLICY, World, header
from patterns_world import Task as Task

ATTEMPTS = 3
"""Budgets, the same spirit for each pattern: a tool call (fused), a step (planner, retried in
place by the service) or an invocation (script) is tried at most ATTEMPTS times on a timeout; the
planner may re-plan at most REPLANS times; the code pattern runs its script at most SCRIPT_RUNS times
(it stops at its first failing call, so each fault costs it a run)."""
REPLANS = 2
SCRIPT_RUNS = 4
STEP_RETRY = {"on": ["limit.timeout"], "max_attempts": ATTEMPTS, "interval_s": 0}
INLINED = {"lib.buy_if_below@proven": BUY_SCRIPT, **{f"bench.{n}@1.0.0": c for n, c in STEP_SCRIPTS.items()}}
"""Workarounds of two service bugs (found by this bench; reported): a plan step with an `approval`
or `postconditions` is posted with its script's code inline (the model writes the script's name;
the harness swaps the code in, counted in no prompt). For a script step, requesting the approval
fails an assertion (plans/approvals.py, request: a code cell only), which leaves the run stuck, and
its postconditions are silently not checked (plans/dispatch.py builds `expect` for code cells only).
Both are fixed in the service since; this stays until the next full run, so that the committed
results are what this code produces."""


def posted(document: dict[str, Any], tools: str) -> dict[str, Any]:
    """A plan or revision as posted: the tools file id filled in, gated or checked script steps inlined."""
    document = fill(document, "<tools>", tools)
    for step in document.get("steps") or document.get("add") or []:
        if ("approval" in step or "postconditions" in step) and step["run"].get("script") in INLINED:
            step["run"] = {"code": INLINED[step["run"]["script"]], "language": "python"}
    return dict(document)


FILES = [{"path": "tools.py", "file_id": "<tools>"}]
KEYED = {"strategy": "key", "key": "buy:{args.ticker}:{args.units}"}  # a template: another units, another key


@dataclass
class Outcome:
    family: str
    task: int
    pattern: str
    expected: float = 0.0
    value: float | None = None
    correct: bool = False
    changed_course: bool = False  # re-planned, rewrote, switched to a backup or halved an order
    calls: list[dict[str, Any]] = field(default_factory=list)  # per model call: role, in, cached, out, noise
    sandbox_ms: float = 0.0
    human_ms: float = 0.0
    executions: int = 0
    approvals: int = 0
    errors: list[str] = field(default_factory=list)


class Model:
    """The scripted model's bookkeeping: tokens counted on the real prompt and completion texts;
    the cached part of a prompt is its longest common prefix with the pattern's fixed header (the
    same for every task) or with an earlier prompt of the same task."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.rng = random.Random(f"model:{outcome.family}:{outcome.task}:{outcome.pattern}")
        self.seen = [header(outcome.pattern)]

    def call(self, role: str, prompt: str, completion: str) -> str:
        prefix = max(len(os.path.commonprefix([prompt, seen])) for seen in self.seen)
        tokens_in = count_tokens(prompt)
        cached = min(tokens_in, count_tokens(prompt[:prefix])) if prefix else 0
        self.seen.append(prompt)
        self.outcome.calls.append({"role": role, "in": tokens_in, "cached": cached, "out": count_tokens(completion),
                                   "noise": round(self.rng.lognormvariate(0, 0.25), 4)})  # fmt: skip
        return completion


ROLES = {"plan": "planner", "replan": "replanner", "join": "joiner"}
TOKEN_BUDGET = 50_000
"""The planner's runs carry `max_tokens` and report each model call as it happens (outside the
measured time), so the run's own usage, per role, is the model's side of the task's cost."""


def report_call(box: Client, run_id: str, outcome: Outcome) -> dict[str, Any]:
    """The model's latest call, reported to the run it belongs to (not timed: the agent's
    bookkeeping); the run as it then stands."""
    call = outcome.calls[-1]
    body = {"model": "scripted", "role": ROLES[call["role"]], "input_tokens": call["in"],
            "output_tokens": call["out"], "call_id": f"{run_id}:{len(outcome.calls)}"}  # fmt: skip
    return dict(box.report_usage(run_id, body))


def timed(outcome: Outcome, action: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return action()
    finally:
        outcome.sandbox_ms += 1000 * (time.perf_counter() - start)


def decide(box: Client, task: Task, outcome: Outcome, approval_id: str) -> None:
    """The simulated person: the task's next seeded decision, posted at once; its delay is computed."""
    decision = task.decisions[min(outcome.approvals, len(task.decisions) - 1)]
    outcome.approvals += 1
    outcome.human_ms += 1000 * decision["delay_s"]
    reject = bool(decision["reject"])
    box.decide_approval(approval_id, {"decision": "reject" if reject else "approve", "decided_by": "bench",
                                      "reason": "too large: halve it" if reject else "fine"})  # fmt: skip


def pending_approval(box: Client, match: Callable[[dict[str, Any]], bool]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for approval in box.list_approvals(status="pending"):
            if match(dict(approval)):
                return approval["id"]
        time.sleep(0.02)
    raise TimeoutError("no pending approval appeared")


def execute(box: Client, task: Task, outcome: Outcome, code: str, tools: str, attempt: int = 1,
            write: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """One execution with the task's tools; `write`: its effect declaration (with an approval, the
    harness decides it)."""
    outcome.executions += 1
    fields: dict[str, Any] = {"files": [{"path": "tools.py", "file_id": tools}], "policy": TOOL_POLICY,
                              "env": {"TOOLS_ATTEMPT": str(attempt)}, **(write or {})}  # fmt: skip

    def go() -> dict[str, Any]:
        execution: dict[str, Any] = dict(box.submit(code, wait_s=None if "approval" in fields else 60, **fields))
        if "approval" in fields:
            decide(box, task, outcome, pending_approval(box, lambda a: a.get("execution_id") == execution["id"]))
        while execution["status"] not in TERMINAL:
            execution = dict(box.get_execution(execution["id"], wait_s=60))
        return execution

    answer: dict[str, Any] = timed(outcome, go)
    return answer


def observation(execution: dict[str, Any]) -> str:
    if execution["status"] == "succeeded":
        return (execution.get("stdout") or json.dumps(execution.get("outputs"))).strip()
    error = execution["error"]
    details = check_details(execution)
    return f"Error ({error['category']}): {error['message']}" + (f" {json.dumps(details)}" if details else "")


def write_fields(task: Task, units: int) -> dict[str, Any]:
    key = f"buy:{task.ticker}:{units}:{task.index}"
    fields: dict[str, Any] = {"effect": "write", "idempotency": {"strategy": "key", "key": key}}
    if units > APPROVAL_UNITS:
        fields["approval"] = {"summary": f"buy {units} {task.ticker} at most {task.limit}"}
    return fields


# -- fused: one model turn per tool call -----------------------------------------------------------


def fused(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    transcript = f"{header('fused')}Question: {task.question}\n"
    values: dict[str, Any] = {}

    def turn(thought: str, code: str, attempt: int = 1, write: dict[str, Any] | None = None) -> dict[str, Any]:
        nonlocal transcript
        transcript += model.call("act", transcript, f"Thought: {thought}\nAction:\n```python\n{code}```\n")
        done = execute(box, task, outcome, code, tools, attempt, write)
        transcript += f"Observation: {observation(done)}\n"
        return done

    def read(call: str) -> bool:
        kind, *args = call.split(":")
        backup, attempt = False, 1
        while True:
            name = f"{kind}_backup" if backup else kind
            done = turn(f"I need {call}.", f"from tools import {name}\nprint({name}({', '.join(map(repr, args))}))\n",
                        attempt)  # fmt: skip
            if done["status"] == "succeeded":
                values[call] = ast.literal_eval(done["stdout"].strip())  # what print() showed: a dict or a float
                return True
            category = done["error"]["category"]
            if category == "check.failed" and not backup:
                backup, outcome.changed_course = True, True
            elif category == "limit.timeout" and attempt < ATTEMPTS:
                attempt += 1
            else:
                outcome.errors.append(category)
                return False

    wrong_first = task.family == "wrongplan"
    for call in task.calls(assume_target=wrong_first):
        if not read(call):
            return None
    quotes = {c.split(":")[1]: v for c, v in values.items() if c.startswith("quote")}
    if wrong_first and task.notices and any(q["currency"] != task.target for q in quotes.values()):
        outcome.changed_course = True  # the observations show other currencies: fetch their rates
        for call in task.rate_calls():
            if not read(call):
                return None
    rates = {c.split(":")[1]: v for c, v in values.items() if c.startswith("rate")}
    if task.family == "lookup":
        value = round(quotes[task.ticker]["price"] * next(iter(rates.values()), 1.0), 2)
    elif task.family == "write":
        value = 0.0
        units, attempt = task.units, 1
        while quotes[task.ticker]["price"] <= (task.limit or 0):
            code = f"from tools import place_order\nimport execbox\nprint(place_order({task.ticker!r}, {units}, " \
                   "execbox.idempotency_key())['units'])\n"  # fmt: skip
            done = turn(f"The price is within the limit: buy {units}.", code, attempt, write_fields(task, units))
            if done["status"] == "succeeded":
                value = float(done["stdout"])
                break
            category = done["error"]["category"]
            if category == "approval.rejected" and units == task.units:
                units, outcome.changed_course = units // 2, True
            elif category == "limit.timeout" and attempt < ATTEMPTS:
                attempt += 1  # the same key: the ledger takes the order once
            else:
                outcome.errors.append(category)
                return None
    else:
        holdings = task.holdings
        code = f"from tools import combine\nprint(combine({quotes!r}, {holdings!r}, {rates!r}))\n"
        done = turn("Now combine.", code)
        if done["status"] != "succeeded":
            outcome.errors.append(done["error"]["category"])
            return None
        value = float(done["stdout"])
    value = float(value)
    model.call("answer", transcript, f"Answer: {value:.2f}")
    return value


# -- planner: plan/v1, run by the service, re-planned from the hand-off -----------------------------


@dataclass
class PlanState:
    backups: set[str] = field(default_factory=set)
    assume_target: bool = False
    units: int = 0
    done: dict[str, str] = field(default_factory=dict)  # call -> id of the completed step holding its value
    calls_of: dict[str, str] = field(default_factory=dict)  # step id -> call


def plan_steps(task: Task, state: PlanState, suffix: str) -> list[dict[str, Any]]:
    """The steps still to run: one per read call not yet done (each naming its library script),
    then the combine or order step referring to them."""
    steps: list[dict[str, Any]] = []
    refs: dict[str, dict[str, Any]] = {}
    for call in task.calls(state.assume_target):
        kind, *args = call.split(":")
        if call in state.done:
            refs[call] = {"$ref": f"/steps/{state.done[call]}/outputs/v"}
            continue
        backup = call in state.backups
        step_id = "_".join([kind[0], *args]).lower() + ("_b" if backup else "") + suffix
        name = f"bench.{kind}{'_backup' if backup else ''}@1.0.0"
        step: dict[str, Any] = {"id": step_id, "run": {"script": name}, "args": {"a": args}, "files": FILES,
                                "policy": TOOL_POLICY, "retry": STEP_RETRY}  # fmt: skip
        if state.assume_target and task.checks and kind == "quote":
            schema = {"properties": {"v": {"properties": {"currency": {"const": task.target}}}}}
            step["postconditions"] = {"outputs_schema": schema}
        steps.append(step)
        state.calls_of[step_id] = call
        refs[call] = {"$ref": f"/steps/{step_id}/outputs/v"}
    if task.family == "write":
        step = {"id": f"order{suffix}", "run": {"script": "bench.order@1.0.0"}, "files": FILES, "policy": TOOL_POLICY,
                "args": {"quote": refs[f"quote:{task.ticker}"], "limit": task.limit, "ticker": task.ticker,
                         "units": state.units}, "retry": STEP_RETRY, "effect": "write",
                "idempotency": KEYED}  # fmt: skip
        if state.units > APPROVAL_UNITS:
            step["approval"] = {"summary": f"buy {state.units} {task.ticker} at most {task.limit}"}
        steps.append(step)
    elif task.family != "lookup":
        quotes = {c.split(":")[1]: r for c, r in refs.items() if c.startswith("quote")}
        rates = {c.split(":")[1]: r for c, r in refs.items() if c.startswith("rate")}
        steps.append({"id": f"total{suffix}", "run": {"script": "bench.combine@1.0.0"}, "files": FILES,
                      "args": {"quotes": quotes, "holdings": task.holdings, "rates": rates}})  # fmt: skip
    return steps


RUN_DEADLINE_S = 300


def drive(box: Client, task: Task, outcome: Outcome, run: dict[str, Any]) -> dict[str, Any]:
    """The run once it neither runs nor waits for a person (the harness decides each approval);
    cancelled after RUN_DEADLINE_S, so that one stuck run does not stop the bench."""
    decided: set[str] = set()
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:
        if run["status"] == "running":
            run = dict(timed(outcome, partial(box.get_run, run["id"], wait_s=20)))
            continue
        if run["status"] != "awaiting_approval":
            return run
        pending = timed(outcome, partial(box.list_approvals, status="pending"))
        mine = [a["id"] for a in pending if a.get("run_id") == run["id"] and a["id"] not in decided]
        for approval_id in mine:
            timed(outcome, partial(decide, box, task, outcome, approval_id))
            decided.add(approval_id)
        if not mine:
            time.sleep(0.02)
        run = dict(timed(outcome, partial(box.get_run, run["id"])))
    timed(outcome, partial(box.cancel_run, run["id"]))
    outcome.errors.append("harness: run stuck")
    return dict(box.get_run(run["id"]))


def replan(task: Task, state: PlanState, handoff: dict[str, Any], outcome: Outcome) -> bool:
    """Read the hand-off as the re-planner would: False when nothing in it can be fixed."""
    for failed in handoff["failed"]:
        category, details = failed["error"]["category"], check_details(failed)
        if category == "check.failed" and "call" in details:
            state.backups.add(details["call"])
        elif category == "output.invalid":
            state.assume_target = False
        elif category == "approval.rejected" and state.units == task.units:
            state.units //= 2
        else:
            outcome.errors.append(category)
            return False
    for completed in handoff["completed"]:
        call = state.calls_of.get(completed["step_id"])
        if call is not None:
            state.done[call] = completed["step_id"]
    outcome.changed_course = True
    return True


Planning = Callable[[PlanState, str], list[dict[str, Any]]]


def run_plan(box: Client, task: Task, tools: str, outcome: Outcome, model: Model, prompt: str,
             state: PlanState, first: Planning) -> dict[str, Any] | None:  # fmt: skip
    """Post the plan `first` writes, drive it, re-plan from each hand-off; the finished run or None."""
    plan: dict[str, Any] = {"format": "plan/v1", "objective": task.question, "budgets": {"max_replans": REPLANS},
                            "steps": first(state, "")}  # fmt: skip
    model.call("plan", prompt, json.dumps(plan))
    budgeted = {**plan, "budgets": {"max_replans": REPLANS, "max_tokens": TOKEN_BUDGET}}  # not in the prompt
    run = dict(timed(outcome, lambda: box.start_run({"plan": posted(budgeted, tools)})))
    report_call(box, run["id"], outcome)
    for round_ in range(REPLANS + 1):
        run = drive(box, task, outcome, run)
        if run["status"] != "needs_replan" or round_ == REPLANS:
            break
        handoff = dict(timed(outcome, partial(box.run_handoff, run["id"])))
        if not replan(task, state, handoff, outcome):
            break
        body = {"base_revision": run["revision"], "reason": "fixing what the hand-off shows",
                "add": first(state, f"_{round_ + 2}")}  # fmt: skip
        model.call("replan", f"{prompt}{json.dumps(plan)}\nHand-off:\n{json.dumps(handoff)}\n", json.dumps(body))
        report_call(box, run["id"], outcome)
        run = dict(timed(outcome, partial(box.revise_run, run["id"], posted(body, tools))))
    outcome.executions += sum(len(step["attempts"]) for step in run["steps"].values())
    if run["status"] != "succeeded":
        outcome.errors.append(str(run.get("stop_reason") or run["status"]))
        return None
    return run


def newest(run: dict[str, Any], prefix: str) -> Any:
    """The output v of the last succeeded step whose id starts with `prefix`."""
    found = [s for name, s in run["steps"].items() if name.startswith(prefix) and s["status"] == "succeeded"]
    return found[-1]["outputs"]["v"]


def planner(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    prompt = f"{header('planner')}Question: {task.question}\n"
    state = PlanState(assume_target=task.family == "wrongplan", units=task.units)
    run = run_plan(box, task, tools, outcome, model, prompt, state, partial(plan_steps, task))
    if run is None:
        return None
    if task.family == "lookup":
        steps = {state.calls_of[name]: s for name, s in run["steps"].items()
                 if s["status"] == "succeeded" and name in state.calls_of}  # fmt: skip
        quote = next(s for call, s in steps.items() if call.startswith("quote"))["outputs"]["v"]
        rate = next((s["outputs"]["v"] for call, s in steps.items() if call.startswith("rate")), 1.0)
        value = round(quote["price"] * rate, 2)
    else:
        value = float(newest(run, "order" if task.family == "write" else "total"))
    outputs = {name: s.get("outputs") for name, s in run["steps"].items() if s["status"] == "succeeded"}
    model.call("join", f"{SYSTEM}\nQuestion: {task.question}\nOutputs of the plan: {json.dumps(outputs)}\n",
               f"Answer: {value:.2f}")  # fmt: skip
    if report_call(box, run["id"], outcome)["usage"]["tokens"] != sum(c["in"] + c["out"] for c in outcome.calls):
        outcome.errors.append("harness: the run's usage differs from the calls made")
    return float(value)


# -- code: the whole task as one script --------------------------------------------------------------


def script_source(task: Task, backups: set[str], assume_target: bool, units: int) -> str:
    lines = ["from tools import combine, place_order, quote, quote_backup, rate, rate_backup", "import execbox",
             "quotes, rates = {}, {}"]  # fmt: skip
    for call in task.calls(assume_target):
        kind, *args = call.split(":")
        name = f"{kind}_backup" if call in backups else kind
        target = f"quotes[{args[0]!r}]" if kind == "quote" else f"rates[{args[0]!r}]"
        lines.append(f"{target} = {name}({', '.join(repr(a) for a in args)})")
    if assume_target and task.checks:
        found = "sorted({q['currency'] for q in quotes.values()})"
        lines.append(f"execbox.check(all(q['currency'] == {task.target!r} for q in quotes.values()), "
                     f"'a holding is quoted in another currency', currencies={found})")  # fmt: skip
    if task.family == "write":
        lines += [f"bought = 0\nif quotes[{task.ticker!r}]['price'] <= {task.limit}:",
                  f"    bought = place_order({task.ticker!r}, {units}, execbox.idempotency_key())['units']",
                  "execbox.emit('answer', bought)"]  # fmt: skip
    else:
        lines += [f"holdings = {task.holdings!r}", "value = combine(quotes, holdings, rates)",
                  "execbox.check(value > 0, 'a portfolio is worth more than nothing', value=value)",
                  "execbox.emit('answer', value)"]  # fmt: skip
    return "\n".join(lines) + "\n"


def code(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    prompt = f"{header('code')}Question: {task.question}\nWrite one script.\n"
    backups: set[str] = set()
    assume_target, units = task.family == "wrongplan", task.units
    source = model.call("write", prompt, f"```python\n{script_source(task, backups, assume_target, units)}```")
    attempt = 1
    for _ in range(SCRIPT_RUNS):
        write = write_fields(task, units) if task.family == "write" else None
        done = execute(box, task, outcome, script_source(task, backups, assume_target, units), tools, attempt, write)
        if done["status"] == "succeeded":
            break
        prompt += f"{source}\nResult: {observation(done)}\n"
        category, details = done["error"]["category"], check_details(done)
        if category == "check.failed" and "call" in details:
            backups.add(details["call"])
            why = "The feed is stale; using the backup."
        elif category == "check.failed" and "currencies" in details:
            assume_target = False
            why = "Some holdings are in other currencies; adding their rates."
        elif category == "approval.rejected" and units == task.units:
            units //= 2
            why = "Rejected: halving the order."
        elif category == "limit.timeout":
            attempt += 1
            source = model.call("rewrite", prompt, "The call timed out; running the same script again.")
            continue
        else:
            outcome.errors.append(category)
            return None
        outcome.changed_course = True
        source = model.call("rewrite", prompt,
                            f"{why}\n```python\n{script_source(task, backups, assume_target, units)}```")  # fmt: skip
    else:
        outcome.errors.append("runs")
        return None
    value = float(done["outputs"]["answer"])
    model.call("answer", f"{SYSTEM}\nQuestion: {task.question}\nOutputs: {json.dumps(done['outputs'])}\n",
               f"Answer: {value:.2f}")  # fmt: skip
    return value


# -- script: one call to a proven library script -------------------------------------------------------


def script(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    prompt = f"{header('script')}Question: {task.question}\n"
    if task.family == "write":
        inputs: dict[str, Any] = {"ticker": task.ticker, "units": task.units, "limit": task.limit}
        state = PlanState(units=task.units)

        def one_step(state: PlanState, suffix: str) -> list[dict[str, Any]]:
            step: dict[str, Any] = {"id": f"buy{suffix}", "run": {"script": "lib.buy_if_below@proven"},
                                    "args": {**inputs, "units": state.units}, "files": FILES, "policy": TOOL_POLICY,
                                    "retry": STEP_RETRY, "effect": "write",
                                    "idempotency": KEYED}  # fmt: skip
            if state.units > APPROVAL_UNITS:
                step["approval"] = {"summary": f"buy {state.units} {task.ticker} at most {task.limit}"}
            return [step]

        run = run_plan(box, task, tools, outcome, model, prompt, state, one_step)
        if run is None:
            return None
        value = float(max((s["outputs"]["answer"] for s in run["steps"].values() if s["status"] == "succeeded"),
                          default=0))  # fmt: skip
    else:
        inputs = {"holdings": task.holdings, "target": task.target}
        model.call("invoke", prompt, json.dumps({"script": "lib.value", "inputs": inputs}))
        for attempt in range(1, ATTEMPTS + 1):
            outcome.executions += 1
            body = {"version": "proven", "inputs": {**inputs, "attempt": attempt},
                    "files": [{"path": "tools.py", "file_id": tools}]}  # fmt: skip
            done = dict(timed(outcome, partial(box.invoke_script, "lib.value", body, wait_s=60)))
            while done["status"] not in TERMINAL:
                done = dict(timed(outcome, partial(box.get_execution, done["id"], wait_s=60)))
            if done["status"] == "succeeded":
                break
            category = done["error"]["category"]
            if category != "limit.timeout" or attempt == ATTEMPTS:
                outcome.errors.append(category)
                return None
            model.call("invoke", f"{prompt}Result: {observation(done)}\n", "Timed out; invoking it again.")
        value = float(done["outputs"]["answer"])
    model.call("answer", f"{SYSTEM}\nQuestion: {task.question}\nOutputs: {json.dumps({'answer': value})}\n",
               f"Answer: {value:.2f}")  # fmt: skip
    return value


# -- direct: no tools -------------------------------------------------------------------------------


def direct(box: Client, task: Task, tools: str, outcome: Outcome, world: World) -> float | None:
    model = Model(outcome)
    rng = random.Random(f"recall:{task.family}:{task.index}")

    def recall(value: float) -> float:
        return (
            value if rng.random() < world.direct_recall else value * (1 + rng.choice([-1, 1]) * rng.uniform(0.03, 0.2))
        )

    goal = task.goal_currency()
    value = round(sum(u * recall(task.book[t]["price"]) * recall(RATES[task.currency(t)]) / RATES[goal]
                      for t, u in task.holdings.items()), 2)  # fmt: skip
    model.call("answer", f"{header('direct')}Question: {task.question}\n", f"Answer: {value:.2f}")
    return value


RUNNERS: dict[str, Callable[..., float | None]] = {"fused": fused, "planner": planner, "code": code,
                                                  "script": script, "direct": direct}  # fmt: skip
