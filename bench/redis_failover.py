"""What surviving the Redis primary costs: acceptance latency, and how long a fail-over takes. A
benchmark: it prints figures and asserts nothing.

Starts its own primary, replica and three Sentinels (scripts/redis-ha, in a temporary directory,
AOF with fsync always as the stack runs it) and, as the API role, writes what accepting an
execution writes (the record SET and the event XADD in one MULTI pipeline):
  direct          a client of the primary's address (today's redis:// setting)
  sentinel        a client made by core/sentinel.py (the primary found through the Sentinels)
  sentinel+wait   the same, then WAIT 1 <timeout>: acknowledged once the replica holds it
  window          WAIT 1 alone after a plain acceptance: how long a write sits on the primary only
Modes take turns in blocks, so drift on a shared machine hits each alike; ratios are against the
direct baseline of this run. Then --failovers times: SIGKILL the primary while a Sentinel client
writes, and time kill -> the Sentinels name a new primary -> the first successful write; the
killed node is started again (and becomes a replica) before the next round.

Usage: python bench/redis_failover.py [--writes 2000] [--block 250] [--failovers 3] [--down-after-ms 2000]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import summary
from execbox.core import sentinel
from execbox.core.redis_roles import role_url

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "redis-ha")
PREFIX = "execbox"


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


class Cluster:
    def __init__(self, root: Path, down_after_ms: int) -> None:
        self.root = root
        self.script_env = {**os.environ, "REDIS_HA_ROOT": str(root), "REDIS_HA_DOWN_AFTER_MS": str(down_after_ms),
                           "EXECBOX_REDIS__KEY_PREFIX": PREFIX}  # fmt: skip

    def start(self) -> float:
        started = time.monotonic()
        subprocess.run([SCRIPT], env=self.script_env, check=True, capture_output=True, timeout=180)
        self.env = env_file(self.root / "redis-ha.env")
        self.passwords = env_file(Path(self.env["REDIS_HA_PASSWORDS"]))
        self.ports = env_file(self.root / "ports.env")
        return time.monotonic() - started

    def stop(self) -> None:
        subprocess.run([SCRIPT, "--stop"], env=self.script_env, check=True, capture_output=True, timeout=180)

    def password(self, role: str) -> str:
        return self.passwords[f"REDIS_{role.upper()}_PASSWORD"]

    def through_sentinel(self) -> redis.Redis:
        target = sentinel.parse(role_url(self.env["REDIS_HA_URL"], "api", self.password("api")))
        return sentinel.sync_client(target, socket_timeout_s=2)

    def direct(self, single_connection: bool = False) -> redis.Redis:
        return redis.Redis(port=self.primary_port(), username="api", password=self.password("api"), socket_timeout=2,
                           single_connection_client=single_connection)  # fmt: skip

    def primary_port(self) -> int:
        asker = redis.Redis(port=int(self.ports["SENTINEL1_PORT"]), username="api", password=self.password("api"))
        _, port = asker.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.env["REDIS_HA_MASTER"])  # type: ignore[no-untyped-call]
        return int(port)

    def primary_pid(self) -> int:
        port = str(self.primary_port())
        (name,) = [name for name, p in self.ports.items() if name.startswith("NODE") and p == port]
        return int((self.root / f"node-{name[4]}.pid").read_text())


def acceptance(client: redis.Redis, wait: bool) -> None:
    execution_id = uuid.uuid4().hex
    # WAIT counts its own connection's writes, so the transaction and the WAIT go in one round
    # trip on one connection: a plain pipeline around MULTI/EXEC.
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("MULTI")  # type: ignore[no-untyped-call]
    pipe.set(f"{PREFIX}:exe:{execution_id}", b'{"status": "queued", "language": "python"}', ex=3600)
    pipe.xadd(f"{PREFIX}:events", {"id": execution_id, "type": "accepted"}, maxlen=10_000, approximate=True)
    pipe.execute_command("EXEC")  # type: ignore[no-untyped-call]
    if wait:
        pipe.execute_command("WAIT", 1, 1000)  # type: ignore[no-untyped-call]
    replies = pipe.execute()
    if wait and replies[-1] < 1:
        raise RuntimeError("WAIT 1 timed out: the replica did not confirm within 1 s")


def window(pinned: redis.Redis) -> float:
    """An acceptance, then WAIT 1 alone, timed (ms), on a client of one connection: how long an
    acknowledged acceptance sits on the primary only, where its death would lose it without WAIT."""
    acceptance(pinned, wait=False)
    start = time.perf_counter()
    if pinned.wait(1, 1000) < 1:
        raise RuntimeError("WAIT 1 timed out: the replica did not confirm within 1 s")
    return (time.perf_counter() - start) * 1000


def latencies(cluster: Cluster, writes: int, block: int) -> dict[str, list[float]]:
    modes: dict[str, tuple[redis.Redis, bool]] = {
        "direct": (cluster.direct(), False),
        "sentinel": (cluster.through_sentinel(), False),
        "sentinel+wait": (cluster.through_sentinel(), True),
    }
    for client, wait in modes.values():  # connections made and first replies seen before timing
        for _ in range(50):
            acceptance(client, wait)
    pinned = cluster.direct(single_connection=True)
    taken: dict[str, list[float]] = {mode: [] for mode in (*modes, "window")}
    while len(taken["direct"]) < writes:
        for mode, (client, wait) in modes.items():
            for _ in range(min(block, writes - len(taken[mode]))):
                start = time.perf_counter()
                acceptance(client, wait)
                taken[mode].append((time.perf_counter() - start) * 1000)
        taken["window"] += [window(pinned) for _ in range(min(block, writes - len(taken["window"])))]
    return taken


def one_failover(cluster: Cluster) -> dict[str, float]:
    client = cluster.through_sentinel()
    acceptance(client, wait=True)
    old = cluster.primary_port()
    pid = cluster.primary_pid()
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    promoted = first_after(lambda: cluster.primary_port() != old, 60)
    failed = 0
    while True:
        try:
            acceptance(client, wait=False)
            break
        except redis.RedisError:
            failed += 1
            if time.monotonic() - killed > 60:
                raise
    written = time.monotonic()
    restart = cluster.start()  # the killed node back, as a replica: the next round has a pair again
    return {"promoted_s": promoted - killed, "first_write_s": written - killed, "failed_tries": failed,
            "rejoin_s": restart}  # fmt: skip


def first_after(condition: Callable[[], bool], timeout_s: float) -> float:
    """The moment a condition (polled every 10 ms, the Sentinels give no notice we can wait on) holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except redis.RedisError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"not within {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--block", type=int, default=250)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--down-after-ms", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="redis-ha-bench-") as scratch:
        cluster = Cluster(Path(scratch) / "ha", args.down_after_ms)
        print(f"scripts/redis-ha: primary, replica and three Sentinels ready in {cluster.start():.1f} s")
        try:
            taken = latencies(cluster, args.writes, args.block)
            base = summary(taken["direct"])
            print(f"\nacceptance (SET + XADD in MULTI, AOF fsync always), {args.writes} writes per mode, ms:")
            print(f"{'mode':<15}{'p50':>8}{'p95':>8}{'p99':>8}{'mean':>8}   ratio p50/p95/p99 to direct")
            for mode, values in taken.items():
                s = summary(values)
                ratios = "/".join(f"{s[k] / base[k]:.2f}" for k in ("p50_ms", "p95_ms", "p99_ms"))
                print(f"{mode:<15}{s['p50_ms']:8.2f}{s['p95_ms']:8.2f}{s['p99_ms']:8.2f}{s['mean_ms']:8.2f}   {ratios}")
            print("(window: the WAIT 1 alone, i.e. how long an acknowledged acceptance is on the primary only)")
            print(f"\nfail-over (SIGKILL of the primary, down-after-milliseconds {args.down_after_ms}):")
            for n in range(1, args.failovers + 1):
                r = one_failover(cluster)
                print(f"  {n}: new primary named after {r['promoted_s']:.2f} s, first acceptance written after "
                      f"{r['first_write_s']:.2f} s ({r['failed_tries']:.0f} failed tries); killed node back as "
                      f"replica in {r['rejoin_s']:.1f} s")  # fmt: skip
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
