"""Back-to-back calls in a session against the same calls as warm one-shot executions, in one run.
A benchmark: it prints figures and asserts nothing.

What an agent working cell by cell does: POST the next call as soon as the last one answered.
Two workloads: `1 + 1` (the hand-off and the kernel's own cost), and a pandas summary of a
DataFrame (a one-shot run must import pandas and rebuild the frame every time; a session keeps
both). Prints p50/p95 per series and the ratio session/one-shot p50. Starts its own Redis, API
and workers like bench/compare.py (warm pool 1 per worker for the one-shot series).

Usage: python bench/sessions.py [--rounds 30] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, summary

SETUP = "import pandas as pd\ndf = pd.DataFrame({'k': [i % 7 for i in range(20000)], 'v': range(20000)})\n"
WORK = {"1 + 1": ("", "1 + 1"), "pandas summary": (SETUP, "df.groupby('k').v.sum().to_dict()")}


def timed(service: Service, code: str, session: str | None = None) -> float:
    body = {"language": "python", "code": code, **({"session": session} if session else {})}
    start = time.perf_counter()
    answer = service.client.post("/v1/executions?wait=60", json=body).json()
    elapsed = (time.perf_counter() - start) * 1000
    assert answer["status"] == "succeeded", answer
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="execbox-sessions-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url)
        try:
            opened = time.perf_counter()
            session = service.client.post("/v1/sessions", json={"language": "python"}).json()["id"]
            timed(service, "0", session)  # waits for the kernel
            print(f"session open to first answer: {(time.perf_counter() - opened) * 1000:.0f} ms")
            for name, (setup, cell) in WORK.items():
                if setup:
                    timed(service, setup, session)
                one_shot, in_session = [], []
                for _ in range(args.rounds):  # interleaved, so that drift hits both alike
                    one_shot.append(timed(service, setup + cell))
                    in_session.append(timed(service, cell, session))
                rows[f"{name}, one-shot warm"] = summary(one_shot)
                rows[f"{name}, session"] = summary(in_session)
            service.client.delete(f"/v1/sessions/{session}")
        finally:
            service.stop()
    for name, row in rows.items():
        print(f"{name}: p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms")
    for name in WORK:
        ratio = rows[f"{name}, session"]["p50_ms"] / rows[f"{name}, one-shot warm"]["p50_ms"]
        print(f"{name}: session / one-shot p50 {ratio:.2f} ({args.rounds} rounds, {args.workers} workers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
