"""One cgroup per run for the bubblewrap helper: memory (and swap), pids and CPU limits, the OOM
count and memory peak, and killing every process in it. cgroup v2 where the host mounts it at
/sys/fs/cgroup, else the v1 controllers (memory, pids, cpu, freezer) mounted under it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "execbox-bwrap"
CPU_PERIOD_US = 100_000


class RunCgroup:
    def __init__(self, name: str, memory_bytes: int, pids: int, cpu: float, root: Path = ROOT) -> None:
        self.v2 = (root / "cgroup.controllers").exists()
        self.dirs: dict[str, Path] = {}
        if self.v2:
            parent = root / PARENT
            parent.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):  # already enabled, or the host keeps a controller to itself
                (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            self.dirs = dict.fromkeys(("memory", "pids", "cpu", "freezer"), parent / name)
        else:
            self.dirs = {c: root / c / PARENT / name for c in ("memory", "pids", "cpu", "freezer")}
        for path in set(self.dirs.values()):
            path.mkdir(parents=True)
            path.chmod(0o755)  # the launcher reads its own OOM count and peak (whatever the helper's umask)
        try:
            self._limit(memory_bytes, pids, cpu)
        except OSError:
            self.remove()
            raise

    def _limit(self, memory_bytes: int, pids: int, cpu: float) -> None:
        quota = max(int(cpu * CPU_PERIOD_US), 1000)
        if self.v2:
            d = self.dirs["memory"]
            (d / "memory.max").write_text(str(memory_bytes))
            (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(pids))
            (d / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
            return
        (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):  # absent without swap accounting: then there is no swap to use
            (self.dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (self.dirs["pids"] / "pids.max").write_text(str(pids))
        (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))

    @property
    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join the run's cgroup(s)."""
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    @property
    def memory_dir(self) -> Path:
        return self.dirs["memory"]

    def pids(self) -> list[int]:
        return _read_pids(self.dirs["pids"] / "cgroup.procs")

    def holds(self, pid: int) -> bool:
        """Whether `pid` is in every one of the run's cgroups (the kernel's word, read back)."""
        return all(pid in _read_pids(Path(f)) for f in self.procs_files)

    def oom_kills(self) -> int:
        """How many processes of the run the kernel's OOM killer ended (the memory limit's work)."""
        path = self.dirs["memory"] / ("memory.events" if self.v2 else "memory.oom_control")
        try:
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def _freeze(self, frozen: bool) -> None:
        with contextlib.suppress(OSError):
            if self.v2:
                (self.dirs["freezer"] / "cgroup.freeze").write_text("1" if frozen else "0")
            else:
                (self.dirs["freezer"] / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def kill(self, within_s: float = 10.0) -> bool:
        """SIGKILL every process in the run: frozen while the signals go out, so that none forks
        meanwhile (a thawed task with a pending SIGKILL never returns to user space), then again
        until the cgroup is empty; True once it is."""
        deadline = time.monotonic() + within_s
        self._freeze(True)
        try:
            self._signal_all()
        finally:
            self._freeze(False)
        while self.pids():
            if time.monotonic() > deadline:
                return False
            self._signal_all()
            time.sleep(0.005)
        return True

    def _signal_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the run's cgroup directories; True once none is left."""
        for path in set(self.dirs.values()):
            with contextlib.suppress(OSError):  # gone already, or still busy: told by what is left
                path.rmdir()
        return not any(path.exists() for path in self.dirs.values())


def sweep_leftovers(prefix: str, root: Path = ROOT, within_s: float = 10.0) -> int:
    """Kill every process in, and remove, each run cgroup whose name starts with `prefix` (a stopped
    helper's own); returns how many."""
    v1 = [root / c / PARENT for c in ("freezer", "pids", "memory", "cpu")]
    parents = [root / PARENT] if (root / "cgroup.controllers").exists() else v1
    found = 0
    for parent in parents:
        for run in [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir()] if parent.is_dir() else []:
            found += 1
            for thaw, value in ((run / "freezer.state", "THAWED"), (run / "cgroup.freeze", "0")):
                with contextlib.suppress(OSError):  # a frozen task takes no SIGKILL until thawed
                    thaw.write_text(value)
            deadline = time.monotonic() + within_s
            while (procs := _read_pids(run / "cgroup.procs")) and time.monotonic() < deadline:
                for pid in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
            with contextlib.suppress(OSError):
                run.rmdir()
    return found


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_text().split()]
    except OSError:
        return []
