"""The figures of bench/patterns.py, recomputed offline from a results JSON: per family and pattern
the latency and token percentiles under the base model profile, and a sensitivity sweep over the
profile (time to first token, output speed, a prompt-cache discount) that finds where the ordering
of the patterns flips. Model time is never measured: it is computed here, per model call, from the
recorded token counts (input, its cached prefix, output) and the call's seeded noise factor; the
measured sandbox time and the computed wait for a person are added as recorded.

Usage: python bench/patterns_sweep.py [bench/results/patterns.json]   (rewrites its charts and
       bench/results/<name>-sweep.json, prints the tables as markdown)
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compare import percentile

RESULTS = Path(__file__).resolve().parent / "results"
BASE = {"ttft_s": 0.45, "prefill_tok_s": 2500.0, "decode_tok_s": 70.0, "cache_discount": 0.0,
        "usd_in_per_mtok": 3.0, "usd_out_per_mtok": 15.0}  # fmt: skip
"""Placeholder figures of a hosted model (not measured here): time to the first token, prompt
tokens per second, output tokens per second, the share of time and price a cached prompt token
saves, and list prices per million tokens."""
GRID = {"ttft_s": [0.1, 0.25, 0.5, 1.0, 2.0], "decode_tok_s": [20.0, 40.0, 80.0, 160.0, 320.0],
        "cache_discount": [0.0, 0.5, 0.9]}  # fmt: skip
RANKED = ["fused", "planner", "code", "script"]
"""The patterns put in order (direct is left out: it is fast and, with private data, wrong)."""
LETTER = {"fused": "F", "planner": "P", "code": "C", "script": "S"}


def call_ms(call: dict[str, Any], profile: dict[str, float]) -> float:
    uncached = call["in"] - profile["cache_discount"] * call["cached"]
    seconds = profile["ttft_s"] + uncached / profile["prefill_tok_s"] + call["out"] / profile["decode_tok_s"]
    return float(1000 * seconds * float(call["noise"]))


def call_usd(call: dict[str, Any], profile: dict[str, float]) -> float:
    uncached = call["in"] - profile["cache_discount"] * call["cached"]
    return float(uncached * profile["usd_in_per_mtok"] + call["out"] * profile["usd_out_per_mtok"]) / 1e6


def latency_ms(row: dict[str, Any], profile: dict[str, float]) -> float:
    return float(sum(call_ms(c, profile) for c in row["calls"]) + row["sandbox_ms"] + row["human_ms"])


def cell(rows: list[dict[str, Any]], profile: dict[str, float]) -> dict[str, Any]:
    if not rows:
        return {"n": 0}
    latency = [latency_ms(r, profile) for r in rows]
    tokens = [float(sum(c["in"] + c["out"] for c in r["calls"])) for r in rows]
    model = [sum(call_ms(c, profile) for c in r["calls"]) for r in rows]
    return {
        "n": len(rows),
        **{f"latency_p{q}_ms": round(percentile(latency, q)) for q in (50, 95, 99)},
        "latency_max_ms": round(max(latency)),
        "model_p50_ms": round(percentile(model, 50)),
        "sandbox_p50_ms": round(percentile([r["sandbox_ms"] for r in rows], 50)),
        "human_p50_ms": round(percentile([r["human_ms"] for r in rows], 50)),
        "model_share": round(sum(model) / sum(latency), 3),
        **{f"tokens_p{q}": int(percentile(tokens, q)) for q in (50, 95, 99)},
        "in_mean": round(statistics.fmean(sum(c["in"] for c in r["calls"]) for r in rows)),
        "cached_mean": round(statistics.fmean(sum(c["cached"] for c in r["calls"]) for r in rows)),
        "out_mean": round(statistics.fmean(sum(c["out"] for c in r["calls"]) for r in rows)),
        "usd_mean": round(statistics.fmean(sum(call_usd(c, profile) for c in r["calls"]) for r in rows), 5),
        "llm_calls_mean": round(statistics.fmean(len(r["calls"]) for r in rows), 2),
        "executions_mean": round(statistics.fmean(r["executions"] for r in rows), 2),
        "approvals_mean": round(statistics.fmean(r["approvals"] for r in rows), 2),
        "accuracy": round(sum(r["correct"] for r in rows) / len(rows), 3),
    }


def table(rows: list[dict[str, Any]], profile: dict[str, float]) -> dict[str, Any]:
    """family -> pattern -> {all, changed, unchanged}."""
    out: dict[str, Any] = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        out[family] = {}
        for pattern in dict.fromkeys(r["pattern"] for r in rows if r["family"] == family):
            mine = [r for r in rows if r["family"] == family and r["pattern"] == pattern]
            changed = [r for r in mine if r["changed_course"]]
            unchanged = [r for r in mine if not r["changed_course"]]
            out[family][pattern] = {"all": cell(mine, profile), "changed": cell(changed, profile),
                                    "unchanged": cell(unchanged, profile)}  # fmt: skip
    return out


def ordering(rows: list[dict[str, Any]], profile: dict[str, float], metric: str) -> list[str]:
    """The ranked patterns, best first, by p50 or p95 latency or mean cost."""

    def score(pattern: str) -> float:
        mine = [r for r in rows if r["pattern"] == pattern]
        if metric == "usd":
            return statistics.fmean(sum(call_usd(c, profile) for c in r["calls"]) for r in mine)
        return percentile([latency_ms(r, profile) for r in mine], 50 if metric == "p50" else 95)

    return sorted((p for p in RANKED if any(r["pattern"] == p for r in rows)), key=score)


def sweep(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every grid point's ordering per family and metric, and the points where it differs from the base's."""
    out: dict[str, Any] = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        out[family] = {}
        for metric in ("p50", "p95", "usd"):
            base = ordering(mine, BASE, metric)
            points: list[dict[str, Any]] = []
            for ttft, decode, discount in itertools.product(*GRID.values()):
                profile = BASE | {"ttft_s": ttft, "decode_tok_s": decode, "cache_discount": discount}
                order = ordering(mine, profile, metric)
                points.append({"ttft_s": ttft, "decode_tok_s": decode, "cache_discount": discount,
                               "order": "".join(LETTER[p] for p in order)})  # fmt: skip
            flips = sorted({str(p["order"]) for p in points} - {"".join(LETTER[p] for p in base)})
            out[family][metric] = {"base": "".join(LETTER[p] for p in base), "orders_seen": flips, "points": points}
    return out


def pairs_flipped(result: dict[str, Any]) -> list[str]:
    """For each family and metric, each pair of patterns whose order differs somewhere on the grid,
    with the share of grid points on which the base's order holds."""
    lines = []
    for family, metrics in result.items():
        for metric, found in metrics.items():
            base = found["base"]
            for a, b in itertools.combinations(base, 2):
                held = [p for p in found["points"] if p["order"].index(a) < p["order"].index(b)]
                if len(held) < len(found["points"]):
                    other = [p for p in found["points"] if p not in held]
                    where = summarize(other)
                    lines.append(f"{family} {metric}: {a} before {b} on {len(held)}/{len(found['points'])} points; "
                                 f"{b} first at {where}")  # fmt: skip
    return lines


def summarize(points: Iterable[dict[str, Any]]) -> str:
    by_discount: dict[float, list[str]] = {}
    for p in points:
        by_discount.setdefault(p["cache_discount"], []).append(f"{p['ttft_s']:g}s/{p['decode_tok_s']:g}")
    return "; ".join(f"cache {d:g}: " + ", ".join(v) for d, v in sorted(by_discount.items()))


def chart_results(tables: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(tables)
    fig, axes = plt.subplots(2, len(families), figsize=(4.2 * len(families), 8), squeeze=False)
    for col, family in enumerate(families):
        patterns = list(tables[family])
        rows = [(("latency_p50_ms", "latency_p95_ms", "latency_p99_ms"), "latency (s)"),
                (("tokens_p50", "tokens_p95", "tokens_p99"), "tokens per task")]  # fmt: skip
        for row, (keys, label) in enumerate(rows):
            ax = axes[row][col]
            for j, key in enumerate(keys):
                values = [tables[family][p]["all"][key] / (1000 if row == 0 else 1) for p in patterns]
                ax.bar(
                    [x + (j - 1) * 0.27 for x in range(len(patterns))],
                    values,
                    0.27,
                    label=key.split("_")[-2 if row == 0 else -1],
                )
            ticks = [f"{p}\nacc {tables[family][p]['all']['accuracy']:.2f}" for p in patterns]
            ax.set_xticks(range(len(patterns)), ticks, fontsize=8)
            ax.set_yscale("log")
            ax.set_title(f"{family}: {label}", fontsize=10)
            ax.legend(fontsize=7)
    fig.suptitle("Agent patterns through execbox at the base profile (model time computed, sandbox time measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def chart_sweep(result: dict[str, Any], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(result)
    discounts = GRID["cache_discount"]
    fig, axes = plt.subplots(len(families), len(discounts), figsize=(4.6 * len(discounts), 3.6 * len(families)),
                             squeeze=False)  # fmt: skip
    orders = sorted({p["order"] for f in result.values() for p in f[metric]["points"]})
    colour = {o: i for i, o in enumerate(orders)}
    for r, family in enumerate(families):
        found = result[family][metric]
        for c, discount in enumerate(discounts):
            ax = axes[r][c]
            grid = [[next(p for p in found["points"] if p["ttft_s"] == t and p["decode_tok_s"] == d
                          and p["cache_discount"] == discount)["order"] for d in GRID["decode_tok_s"]]
                    for t in GRID["ttft_s"]]  # fmt: skip
            ax.imshow([[colour[o] for o in line] for line in grid], cmap="tab20", vmin=0, vmax=19, aspect="auto")
            for i, line in enumerate(grid):
                for j, order in enumerate(line):
                    weight = "normal" if order == found["base"] else "bold"
                    ax.text(j, i, order, ha="center", va="center", fontsize=8, fontweight=weight)
            ax.set_xticks(range(len(GRID["decode_tok_s"])), [f"{d:g}" for d in GRID["decode_tok_s"]])
            ax.set_yticks(range(len(GRID["ttft_s"])), [f"{t:g}" for t in GRID["ttft_s"]])
            ax.set_xlabel("output tokens/s")
            ax.set_ylabel("time to first token (s)")
            ax.set_title(f"{family}, cache discount {discount:g} (base {found['base']})", fontsize=9)
    fig.suptitle(f"Ordering by {metric} (best first; F fused, P planner, C code, S script; bold: differs from base)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(tables: dict[str, Any]) -> str:
    lines = []
    for family, patterns in tables.items():
        lines += [f"\n#### {family}\n", "| pattern | runs | n | p50 s | p95 s | p99 s | max s | model share "
                  "| tokens p50 | p95 | p99 | in (cached) / out | $ mean | calls | execs | approvals | accuracy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for pattern, splits in patterns.items():
            for split, c in splits.items():
                if not c["n"] or (split != "all" and c["n"] == splits["all"]["n"]):
                    continue
                lines.append(f"| {pattern} | {split} | {c['n']} | {c['latency_p50_ms'] / 1000:.1f} | "
                             f"{c['latency_p95_ms'] / 1000:.1f} | {c['latency_p99_ms'] / 1000:.1f} | "
                             f"{c['latency_max_ms'] / 1000:.1f} | {c['model_share']:.2f} | {c['tokens_p50']:,} | "
                             f"{c['tokens_p95']:,} | {c['tokens_p99']:,} | {c['in_mean']:,} ({c['cached_mean']:,}) / "
                             f"{c['out_mean']:,} | {c['usd_mean']:.4f} | {c['llm_calls_mean']:.2f} | "
                             f"{c['executions_mean']:.2f} | {c['approvals_mean']:.2f} | "
                             f"{c['accuracy']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def analyse(document: dict[str, Any], name: str) -> dict[str, Any]:
    """Tables, sweep and charts from a results document; writes <name>-sweep.json and the PNGs."""
    rows = document["outcomes"]
    tables = table(rows, BASE)
    result = sweep(rows)
    RESULTS.mkdir(exist_ok=True)
    chart_results(tables, RESULTS / f"{name}.png")
    for metric in ("p50", "p95", "usd"):
        chart_sweep(result, metric, RESULTS / f"{name}-sweep-{metric}.png")
    flipped = pairs_flipped(result)
    saved = {"base": BASE, "grid": GRID, "ranked": RANKED, "sweep": result, "pairs_flipped": flipped}
    (RESULTS / f"{name}-sweep.json").write_text(json.dumps(saved, indent=1) + "\n")
    return {"tables": tables, "sweep": result, "pairs_flipped": flipped}


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "patterns.json"
    found = analyse(json.loads(path.read_text()), path.stem)
    print(markdown(found["tables"]))
    for family, metrics in found["sweep"].items():
        print(
            f"{family}: "
            + "; ".join(f"{m} base {v['base']}, also {v['orders_seen'] or '-'}" for m, v in metrics.items())
        )
    print("\n".join(found["pairs_flipped"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
