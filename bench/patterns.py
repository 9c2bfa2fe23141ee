"""Agent patterns on the same tasks through the real service, to decide between them: a fused loop,
planner-executor, plan-as-code, one call to a proven library script, and direct generation as the
baseline. A benchmark: it prints and writes figures and asserts nothing. The write-up is
docs/patterns.md.

Task families (patterns_world.py), each with its own seeded tasks:
  lookup     1-2 read calls: one ticker's price, in its own currency or another
  fanout     5-8 holdings: a quote each, a rate per other currency, a combine (10-13 calls)
  write      read a quote, then buy if the price is within a limit: an order is a write that
             declares an idempotency key; orders over 100 units wait for a person's approval
  wrongplan  3-5 holdings whose first plan assumes every quote is in the target currency; a
             check catches it only when the pattern has one (seeded: patterns_world.World)

Patterns (patterns_agents.py), each through execbox (warm pool 1-4 per worker, two workers):
  fused     one model turn per tool call, each call one execution, the transcript re-sent
  planner   a plan/v1 of library-script steps run by the service; re-planned from the hand-off
  code      one script for the whole task, one execution; rewritten on a failure
  script    one call invoking a proven library script (a one-step plan for the write)
  direct    one call answering from the model's memory, nothing executed (not for writes)

What is simulated, what is measured: the model is scripted and its time is computed from token
counts under a profile (bench/patterns_sweep.py), never slept; a person's approval delay is
computed, the decision posted at once; sandbox time (every execution, plan step, invocation and
the service's waits) is measured wall time. Faults are injected at seeded rates per call.

Writes bench/results/NAME.json (every task's outcome, with each model call's tokens, cached prefix
and noise), NAME-sweep.json and the charts; prints the tables and where the ordering flips.

Usage: python bench/patterns.py [--tasks 101] [--families lookup fanout write wrongplan] [--name patterns]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from execbox_client import Client

from agent import TOKENIZER, count_tokens
from compare import Service, redis_server
from patterns_agents import ATTEMPTS, REPLANS, RUNNERS, SCRIPT_RUNS, Outcome, direct
from patterns_sweep import BASE, RESULTS, analyse, markdown
from patterns_world import (
    FAMILIES,
    PLAN_DOC,
    PROVEN,
    PROVEN_POLICY,
    STEP_SCRIPTS,
    TOOL_POLICY,
    World,
    header,
    make_tasks,
)

PATTERNS = ["fused", "planner", "code", "script", "direct"]


def setup_library(box: Client, world: World) -> None:
    """The planner's step scripts (drafts), and the proven scripts: registered, invoked once on a
    fault-free task as evidence, promoted."""
    for name, source in STEP_SCRIPTS.items():
        box.register_script({"name": f"bench.{name}", "version": "1.0.0", "code": source})
    clean = make_tasks("lookup", 1, World(semantic=0, transient=0))[0]
    tools = box.upload_file("tools.py", clean.tools_py().encode())["id"]
    files = [{"path": "tools.py", "file_id": tools}]
    evidence_inputs = {"lib.value": {"holdings": clean.holdings, "target": "EUR"},
                       "lib.buy_if_below": {"ticker": clean.ticker, "units": 1, "limit": 0}}  # fmt: skip
    for name, source in PROVEN.items():
        box.register_script({"name": name, "version": "1.0.0", "code": source, "default_policy": PROVEN_POLICY})
        done = box.invoke_script(name, {"version": "1.0.0", "inputs": evidence_inputs[name], "files": files}, wait_s=60)
        if done["status"] != "succeeded":
            raise SystemExit(f"{name} failed its evidence run: {done.get('error')}")
        box.promote_script(name, "1.0.0", {"status": "proven", "evidence": [done["id"]]})


def run_all(box: Client, families: list[str], count: int, world: World) -> list[Outcome]:
    tasks = {family: make_tasks(family, count, world) for family in families}
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    for index in range(count):
        for family in families:
            task = tasks[family][index]
            tools = box.upload_file("tools.py", task.tools_py().encode())["id"]
            patterns = [p for p in PATTERNS if not (family == "write" and p == "direct")]
            shift = index % len(patterns)  # a different pattern goes first on each task: no order bias
            for pattern in patterns[shift:] + patterns[:shift]:
                outcome = Outcome(family, index, pattern, expected=task.answer())
                try:
                    if pattern == "direct":
                        outcome.value = direct(box, task, tools, outcome, world)
                    else:
                        outcome.value = RUNNERS[pattern](box, task, tools, outcome)
                except Exception as exc:  # a benchmark records a harness failure and goes on
                    outcome.errors.append(f"harness: {exc!r}"[:300])
                    print(f"  {family} {index} {pattern}: {exc!r}", flush=True)
                outcome.correct = outcome.value is not None and abs(outcome.value - outcome.expected) < 0.005
                outcomes.append(outcome)
        elapsed = time.perf_counter() - started
        print(f"task {index + 1}/{count} of each family, {elapsed:.0f} s "
              f"(about {elapsed / (index + 1) * (count - index - 1):.0f} s to go)", flush=True)  # fmt: skip
    return outcomes


def write_document(path: Path, document: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Indented, but one line per outcome, so that the file stays readable and diffs stay small."""
    head = json.dumps(document, indent=1)
    body = ",\n".join("  " + json.dumps(row, separators=(",", ":")) for row in rows)
    path.write_text(head[:-2] + ',\n "outcomes": [\n' + body + "\n ]\n}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=101, help="per family (101: the least n whose p99 is not the max)")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--name", default="patterns", help="results: bench/results/NAME.json, NAME*.png")
    args = parser.parse_args()
    world = World()
    classes = json.dumps([{"language": "python", "min": 1, "max": 4}])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="execbox-patterns-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url, {"EXECBOX_POOL__CLASSES": classes})
        try:
            with Client(service.url, None, timeout_s=120) as box:
                box.run("print(1)", wait_s=60)  # the first start-up of the images is not any pattern's
                setup_library(box, world)
                outcomes = run_all(box, args.families, args.tasks, world)
        finally:
            service.stop()
    wall = time.perf_counter() - started
    prompts = {p: count_tokens(header(p)) for p in PATTERNS} | {"plan_v1_description": count_tokens(PLAN_DOC)}
    document = {"command": "python bench/patterns.py " + " ".join(sys.argv[1:]), "args": vars(args),
                "world": asdict(world), "base_profile": BASE, "tokenizer": TOKENIZER,
                "budgets": {"attempts": ATTEMPTS, "replans": REPLANS, "script_runs": SCRIPT_RUNS},
                "tool_policy": TOOL_POLICY, "prompt_header_tokens": prompts, "wall_s": round(wall, 1)}  # fmt: skip
    rows = [asdict(o) for o in outcomes]
    RESULTS.mkdir(exist_ok=True)
    found = analyse({"outcomes": rows}, args.name)
    document["table_at_base"] = found["tables"]
    write_document(RESULTS / f"{args.name}.json", document, rows)
    print(f"\n{args.tasks} tasks per family; tokens: {TOKENIZER}; {wall:.0f} s; prompt headers {prompts}")
    print(markdown(found["tables"]))
    for family, metrics in found["sweep"].items():
        print(
            f"{family}: "
            + "; ".join(f"{m} base {v['base']}, also {v['orders_seen'] or '-'}" for m, v in metrics.items())
        )
    print(f"{len(found['pairs_flipped'])} pairs change order somewhere on the grid ({args.name}-sweep.json)")
    print(f"wrote {RESULTS / args.name}.json, {args.name}-sweep.json and the charts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
