"""The E2B facade against the native session API, in one run: what an agent on E2B's SDK waits for
(create -> first run_code("1+1") -> kill) and back-to-back cells, beside the same through
/v1/sessions and /v1/executions; then, in the facade alone, what its other calls cost against its
own plain cell: cells alternating between two Python contexts, a JavaScript context's cell, a
file's write and read, a command. A benchmark: it prints figures and asserts nothing.

The rounds interleave the two paths so that drift hits both alike. Starts its own Redis, API and
workers like bench/compare.py; the SDK is the unmodified `e2b-code-interpreter`, pointed at the
service by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL only.

Usage: python bench/e2b_facade.py [--rounds 10] [--cells 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Service, redis_server, summary


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def native_cell(service: Service, session: str, code: str) -> None:
    body = {"language": "python", "code": code, "session": session}
    answer = service.client.post("/v1/executions?wait=60", json=body).json()
    assert answer["status"] == "succeeded", answer


def native_round(service: Service) -> tuple[float, str]:
    start = time.perf_counter()
    session = service.client.post("/v1/sessions", json={"language": "python"}).json()["id"]
    native_cell(service, session, "1+1")
    return ms(start), session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execbox-e2b-") as tmp, redis_server(Path(tmp)) as redis_url:
        service = Service(args.workers, 1, Path(tmp), redis_url)
        os.environ.update(E2B_API_KEY="bench", E2B_API_URL=f"{service.url}/e2b",
                          E2B_SANDBOX_URL=f"{service.url}/e2b/sandbox")  # fmt: skip
        from e2b_code_interpreter import Sandbox

        series: dict[str, list[float]] = {k: [] for k in ("facade: create -> first cell", "native: open -> first cell",
                                                          "facade: kill", "native: delete", "facade: cell",
                                                          "native: cell", "facade: two Python contexts, alternating",
                                                          "facade: JavaScript context cell",
                                                          "facade: file write + read (1 KiB)",
                                                          "facade: command")}  # fmt: skip
        try:
            for _ in range(args.rounds):
                start = time.perf_counter()
                sbx = Sandbox.create(timeout=120)
                assert sbx.run_code("1+1").text == "2"
                series["facade: create -> first cell"].append(ms(start))
                elapsed, session = native_round(service)
                series["native: open -> first cell"].append(elapsed)
                for _ in range(args.cells if not series["facade: cell"] else 0):
                    start = time.perf_counter()
                    sbx.run_code("1+1")
                    series["facade: cell"].append(ms(start))
                    start = time.perf_counter()
                    native_cell(service, session, "1+1")
                    series["native: cell"].append(ms(start))
                if len(series["facade: command"]) == 0:
                    other = sbx.create_code_context()
                    payload = b"x" * 1024
                    for n in range(args.cells):
                        start = time.perf_counter()
                        sbx.run_code("1+1", context=other if n % 2 else None)
                        series["facade: two Python contexts, alternating"].append(ms(start))
                        start = time.perf_counter()
                        sbx.run_code("1+1", language="javascript")
                        series["facade: JavaScript context cell"].append(ms(start))
                        start = time.perf_counter()
                        sbx.files.write("bench.bin", payload)
                        assert sbx.files.read("bench.bin", format="bytes") == payload
                        series["facade: file write + read (1 KiB)"].append(ms(start))
                        start = time.perf_counter()
                        sbx.commands.run("true")
                        series["facade: command"].append(ms(start))
                start = time.perf_counter()
                sbx.kill()
                series["facade: kill"].append(ms(start))
                start = time.perf_counter()
                service.client.delete(f"/v1/sessions/{session}")
                series["native: delete"].append(ms(start))
        finally:
            service.stop()
    rows = {name: summary(values) for name, values in series.items()}
    for name, row in rows.items():
        print(f"{name}: p50 {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms ({len(series[name])} samples)")
    for what, facade, native in (
        ("create -> first cell", "facade: create -> first cell", "native: open -> first cell"),
        ("cell", "facade: cell", "native: cell"),
        ("end", "facade: kill", "native: delete"),
    ):
        print(f"{what}: facade / native p50 {rows[facade]['p50_ms'] / rows[native]['p50_ms']:.2f}")
    for name in ("facade: two Python contexts, alternating", "facade: JavaScript context cell",
                 "facade: file write + read (1 KiB)", "facade: command"):  # fmt: skip
        print(f"{name} / facade: cell, p50 {rows[name]['p50_ms'] / rows['facade: cell']['p50_ms']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
