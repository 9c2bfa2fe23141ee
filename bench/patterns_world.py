"""The world bench/patterns.py runs its agents in: the task families, the tools a task's sandbox
imports, the library scripts, the seeded faults and human decisions, and the prompt texts (with
the plan/v1 description the planner is given).

Everything here is a fixture of the bench, chosen by seed; nothing is measured here.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ["lookup", "fanout", "write", "wrongplan"]
CURRENCIES = ["USD", "EUR", "GBP", "NOK", "JPY"]
RATES = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "NOK": 0.094, "JPY": 0.0067}  # value of one unit in USD
APPROVAL_UNITS = 100
"""An order of more than this many units needs a person's approval (the task says so)."""


@dataclass
class World:
    """The assumptions a run is made under (all written to the results JSON)."""

    semantic: float = 0.04  # per read call: the primary feed is stale (check.failed until the backup is used)
    transient: float = 0.02  # per read call: the call hangs past its limit once (limit.timeout)
    write_transient: float = 0.10  # per order: the ledger took it, then the answer was lost (limit.timeout)
    check_rate: float = 0.8  # the scripted planner/code model writes the check that catches a wrong assumption
    notice_rate: float = 0.95  # the scripted fused model notices the currency in an observation it has read
    direct_recall: float = 0.3  # the direct baseline recalls a price or rate exactly
    reject_rate: float = 0.15  # the person rejects an order's first approval ("halve it")
    human_median_s: float = 30.0  # the person's decision delay (log-normal, sigma 0.8): computed, not slept


@dataclass
class Task:
    family: str
    index: int
    holdings: dict[str, int]
    target: str | None  # None: a lookup in the ticker's own currency
    book: dict[str, dict[str, Any]]
    faults: dict[str, str] = field(default_factory=dict)
    limit: float | None = None  # write: buy only at or below this price
    decisions: list[dict[str, Any]] = field(default_factory=list)  # write: the person, one per approval asked
    checks: bool = True  # wrongplan: the planner/code model writes the check
    notices: bool = True  # wrongplan: the fused model notices

    @property
    def ticker(self) -> str:
        return next(iter(self.holdings))

    @property
    def units(self) -> int:
        return self.holdings[self.ticker]

    @property
    def question(self) -> str:
        if self.family == "lookup":
            where = f"in {self.target}" if self.target else "in its own currency"
            return f"What is one {self.ticker} worth {where}?"
        if self.family == "write":
            return (f"Buy {self.units} {self.ticker} if its price is at most {self.limit} "
                    f"(in its own currency); orders over {APPROVAL_UNITS} units need a person's approval. "
                    "How many units were bought?")  # fmt: skip
        listed = ", ".join(f"{units} {ticker}" for ticker, units in self.holdings.items())
        return f"What are {listed} worth in {self.target}?"

    def currency(self, ticker: str) -> str:
        return str(self.book[ticker]["currency"])

    def goal_currency(self) -> str:
        return self.target or self.currency(self.ticker)

    def rate_calls(self) -> list[str]:
        goal = self.goal_currency()
        return [f"rate:{c}:{goal}" for c in sorted({self.currency(t) for t in self.holdings} - {goal})]

    def calls(self, assume_target: bool = False) -> list[str]:
        """The read calls of the right plan (or, assume_target, of the first plan in the wrongplan
        family: every holding taken to be quoted in the target currency, so no rates)."""
        quotes = [f"quote:{t}" for t in self.holdings]
        if self.family == "write":
            return quotes
        return quotes + ([] if assume_target else self.rate_calls())

    def answer(self) -> float:
        """Computed as combine() does (same operations, same order), so that rounding agrees."""
        if self.family == "write":
            price = float(self.book[self.ticker]["price"])
            if self.limit is None or price > self.limit:
                return 0.0
            rejected = self.units > APPROVAL_UNITS and self.decisions[0]["reject"]
            return float(self.units // 2 if rejected else self.units)
        goal = self.goal_currency()
        rate = {c: RATES[c] / RATES[goal] for c in CURRENCIES if c != goal}
        value = sum(
            u * self.book[t]["price"] * rate.get(self.book[t]["currency"], 1.0) for t, u in self.holdings.items()
        )
        return round(float(value), 2)

    def tools_py(self) -> str:
        return TOOLS_PY.format(book=repr(self.book), rates=repr(RATES), faults=repr(self.faults), seed=self.index)


def make_book() -> dict[str, dict[str, Any]]:
    rng = random.Random(2026)
    return {f"T{n:02d}": {"price": round(rng.uniform(5, 500), 2), "currency": rng.choice(CURRENCIES)}
            for n in range(40)}  # fmt: skip


def make_tasks(family: str, count: int, world: World) -> list[Task]:
    """`count` tasks of one family, each from its own seed (family, index)."""
    book = make_book()
    tickers = sorted(book)
    tasks = []
    for index in range(count):
        rng = random.Random(f"{family}:{index}")
        if family == "lookup":
            task = Task(family, index, {rng.choice(tickers): 1}, rng.choice([None, *CURRENCIES]), book)
        elif family == "fanout":
            picked = rng.sample(tickers, rng.randint(4, 7))
            task = Task(family, index, {t: rng.randint(1, 200) for t in picked}, rng.choice(CURRENCIES), book)
        elif family == "write":
            ticker = rng.choice(tickers)
            limit = round(book[ticker]["price"] * rng.uniform(0.8, 1.6), 2)  # about a quarter are not bought
            task = Task(family, index, {ticker: rng.randint(20, 200)}, None, book, limit=limit)
            for asked in range(4):
                task.decisions.append({"delay_s": world.human_median_s * math.exp(rng.gauss(0, 0.8)),
                                       "reject": asked == 0 and rng.random() < world.reject_rate})  # fmt: skip
        else:  # wrongplan: at least one holding is quoted in another currency than the target
            while True:
                picked = rng.sample(tickers, rng.randint(3, 5))
                target = rng.choice(CURRENCIES)
                if any(book[t]["currency"] != target for t in picked):
                    break
            task = Task(family, index, {t: rng.randint(1, 200) for t in picked}, target, book)
            task.checks, task.notices = rng.random() < world.check_rate, rng.random() < world.notice_rate
        fault_rng = random.Random(f"faults:{family}:{index}")
        for call in task.calls():
            roll = fault_rng.random()
            if roll < world.semantic:
                task.faults[call] = "semantic"
            elif roll < world.semantic + world.transient:
                task.faults[call] = "transient"
        if family == "write" and fault_rng.random() < world.write_transient:
            task.faults[f"order:{task.ticker}"] = "transient"
        tasks.append(task)
    return tasks


TOOL_POLICY = {"timeout_s": 1}
PROVEN_POLICY = {"timeout_s": 2}
"""A proven script makes up to 13 tool calls in one execution, so its limit is longer than a call's."""

TOOLS_PY = '''\
"""Benchmark tools over a fixture book (generated by bench/patterns_world.py)."""
import math, os, random, time
import execbox

BOOK = {book}
RATES = {rates}
FAULTS = {faults}
SEED = {seed}


def _attempt():
    return int(execbox.context.get("attempt") or os.environ.get("TOOLS_ATTEMPT", "1"))


def _io(key):
    rng = random.Random(f"{{SEED}}:{{key}}")
    time.sleep(0.04 * math.exp(rng.gauss(0, 0.6)))


def _call(key):
    _io(key)
    fault = FAULTS.get(key)
    if fault == "semantic":
        execbox.check(False, "the primary feed is stale", call=key, use="the backup tool")
    if fault == "transient" and _attempt() == 1:
        time.sleep(30)


def stale(key):
    """Whether the primary feed for a call is stale (a health probe, as a proven script would ask)."""
    _io("probe:" + key)
    return FAULTS.get(key) == "semantic"


def quote(ticker):
    _call(f"quote:{{ticker}}")
    return dict(BOOK[ticker])


def quote_backup(ticker):
    _io(f"backup:{{ticker}}")
    return dict(BOOK[ticker])


def rate(src, dst):
    _call(f"rate:{{src}}:{{dst}}")
    return RATES[src] / RATES[dst]


def rate_backup(src, dst):
    _io(f"backup:{{src}}:{{dst}}")
    return RATES[src] / RATES[dst]


def combine(quotes, holdings, rates):
    return round(sum(units * quotes[t]["price"] * rates.get(quotes[t]["currency"], 1.0)
                     for t, units in holdings.items()), 2)


def place_order(ticker, units, key):
    """Write to the (simulated) ledger, which takes each key once; a transient fault here is the
    ledger taking the order and the answer being lost."""
    if not key:
        raise ValueError("an order needs an idempotency key")
    _call(f"order:{{ticker}}")
    return {{"order": key, "ticker": ticker, "units": units}}
'''

STEP_CODE = "from tools import {name}\nimport execbox\nexecbox.emit('v', {name}(*execbox.inputs['a']))\n"
COMBINE_CODE = ("from tools import combine\nimport execbox\na = execbox.inputs\n"
                "execbox.emit('v', combine(a['quotes'], a['holdings'], a['rates']))\n")  # fmt: skip
ORDER_CODE = """from tools import place_order
import execbox
a = execbox.inputs
bought = 0
if a['quote']['price'] <= a['limit']:
    bought = place_order(a['ticker'], a['units'], execbox.idempotency_key())['units']
execbox.emit('v', bought)
"""
STEP_SCRIPTS = {**{name: STEP_CODE.format(name=name) for name in ("quote", "quote_backup", "rate", "rate_backup")},
                "combine": COMBINE_CODE, "order": ORDER_CODE}  # fmt: skip
"""Draft library scripts (bench.<name>@1.0.0) the planner's steps name instead of carrying code."""

VALUE_SCRIPT = """import os
import execbox
a = execbox.inputs
os.environ['TOOLS_ATTEMPT'] = str(a.get('attempt', 1))
from tools import combine, quote, quote_backup, rate, rate_backup, stale
quotes = {t: quote_backup(t) if stale(f'quote:{t}') else quote(t) for t in a['holdings']}
goal = a.get('target') or next(iter(quotes.values()))['currency']
rates = {}
for c in sorted({q['currency'] for q in quotes.values()} - {goal}):
    rates[c] = rate_backup(c, goal) if stale(f'rate:{c}:{goal}') else rate(c, goal)
execbox.emit('answer', combine(quotes, a['holdings'], rates))
"""
BUY_SCRIPT = """import execbox
a = execbox.inputs
from tools import place_order, quote, quote_backup, stale
q = quote_backup(a['ticker']) if stale(f"quote:{a['ticker']}") else quote(a['ticker'])
bought = 0
if q['price'] <= a['limit']:
    bought = place_order(a['ticker'], a['units'], execbox.idempotency_key())['units']
execbox.emit('answer', bought)
"""
PROVEN = {"lib.value": VALUE_SCRIPT, "lib.buy_if_below": BUY_SCRIPT}
"""The "existing proven script" rung: library scripts promoted to proven before the bench starts.
They encode what earlier runs learned (probe the feed, find the currencies from the quotes), so
they are right on every task here by construction: the bench measures what calling one costs."""

SYSTEM = (
    "You are an assistant that answers questions about portfolios and places orders. You can call "
    "tools by writing Python; every call runs in a sandbox and you see what it prints or emits. Prefer "
    "exact figures from the tools over what you remember. If a tool fails, read the error and decide "
    "whether to retry, use another tool, or stop. Answer with one number rounded to two decimals."
)
TOOLS_DOC = """Tools (module `tools`, file tools.py):
- quote(ticker) -> {"price": float, "currency": str}: the latest price from the primary feed.
- quote_backup(ticker) -> same: the secondary feed; use it when the primary is stale.
- rate(src, dst) -> float: the exchange rate from src to dst.
- rate_backup(src, dst) -> float: the same from the secondary source.
- combine(quotes, holdings, rates) -> float: the value of holdings {ticker: units} in the rates' target
  currency; a currency missing from rates is the target itself.
- place_order(ticker, units, key) -> {"order", "ticker", "units"}: a write to the ledger; `key` is the
  idempotency key (the ledger takes a key once). Declare the execution's effect as a write with a key:
  {"effect": "write", "idempotency": {"strategy": "key", "key": "..."}}, and in the code pass
  execbox.idempotency_key(). Orders that need approval add {"approval": {"summary": "..."}}."""
PLAN_DOC = """plan/v1, the body of POST /v1/runs {"plan": ...}: a DAG of steps the service runs; you write it, \
it calls no model.
{"format": "plan/v1", "objective": str, "budgets": {"max_replans": int},
 "steps": [{"id": str (unique, never reused),
   "run": {"script": "name@version"} or {"code": str, "language": "python"},
   "args": {name: JSON value | {"$ref": "/steps/<id>/outputs/<name>"}},  (a $ref is also a dependency)
   "files": [{"path": "tools.py", "file_id": "<tools>"}],
   "policy": {"timeout_s": int}, "retry": {"on": ["limit.timeout"], "max_attempts": int, "interval_s": 0},
   "postconditions": {"outputs_schema": JSON Schema of the step's outputs},  (unmet: output.invalid)
   "effect": "read" | "write",  (a write needs "idempotency": {"strategy": "key", "key": "text {args.x}"})
   "approval": {"summary": str}}]}  (the step waits for a person's decision)
A step's code reads execbox.inputs (its args) and declares outputs with execbox.emit(name, value).
Failures other than a retried timeout stop the run as needs_replan: GET .../handoff lists completed steps
(with outputs) and failed ones (error category, message, details). Continue with POST .../revisions
{"base_revision": int, "reason": str, "add": [new steps; they may refer to completed steps]}."""
LIBRARY_STEPS = """Library scripts for steps (args "a": the tool's arguments as a list; output "v"):
bench.quote@1.0.0, bench.quote_backup@1.0.0, bench.rate@1.0.0, bench.rate_backup@1.0.0;
bench.combine@1.0.0 (args quotes {ticker: quote}, holdings, rates {currency: rate}; output v);
bench.order@1.0.0 (args quote, limit, ticker, units; buys when quote.price <= limit; output v: units bought)."""
LIBRARY_PROVEN = """Proven library scripts (GET /v1/scripts?q=), invoked with {"version": "proven", "inputs", "files"}:
- lib.value: inputs {"holdings": {ticker: units}, "target": currency or null (the first holding's own)};
  output "answer": the holdings' value in the target currency (stale feeds and currencies handled).
- lib.buy_if_below: a write (declare effect, key, approval as for any write step), inputs {"ticker",
  "units", "limit"}; output "answer": units bought (0 when the price is above the limit).
To run one as a write, post a one-step plan whose step is {"run": {"script": "lib.buy_if_below@proven"}}."""
FEW_SHOT = {
    "fused": "Example:\nQuestion: What are 10 XYZ worth in EUR?\nThought: I need XYZ's quote.\nAction:\n```python\n"
    "print(quote('XYZ'))\n```\nObservation: {'price': 2.0, 'currency': 'USD'}\nThought: I need USD->EUR.\nAction:\n"
    "```python\nprint(rate('USD', 'EUR'))\n```\nObservation: 0.9\nAnswer: 18.00",
    "planner": "Example plan: steps q0 (quote XYZ), r0 (rate USD->EUR), total (combine, args referring to "
    "/steps/q0/outputs/v and /steps/r0/outputs/v). Write plan/v1 JSON only.",
    "code": "Example:\n```python\nfrom tools import quote, rate\nimport execbox\nq = quote('XYZ')\n"
    "execbox.emit('answer', round(10 * q['price'] * rate(q['currency'], 'EUR'), 2))\n```",
    "script": 'Example: {"script": "lib.value", "inputs": {"holdings": {"XYZ": 10}, "target": "EUR"}}. '
    "Write the call as JSON only.",
    "direct": "Answer from what you know. Example: Question: What are 10 XYZ worth in EUR? Answer: 18.00",
}


def header(pattern: str) -> str:
    """The part of a pattern's first prompt that is the same for every task (cacheable across tasks)."""
    parts = {"fused": [SYSTEM, TOOLS_DOC], "planner": [SYSTEM, TOOLS_DOC, LIBRARY_STEPS, PLAN_DOC],
             "code": [SYSTEM, TOOLS_DOC], "script": [SYSTEM, LIBRARY_PROVEN], "direct": [SYSTEM]}[pattern]  # fmt: skip
    return "\n\n".join([*parts, FEW_SHOT[pattern]]) + "\n\n"
