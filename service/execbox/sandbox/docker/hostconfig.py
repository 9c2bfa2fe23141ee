"""Every protection of DESIGN.md's 'Every sandbox, always', as the engine's container settings."""

from __future__ import annotations

from typing import Any

from docker.types import DriverConfig, Mount, Ulimit

from execbox.sandbox.runtime import DEPLOYMENT_LABEL, MANAGED_LABEL, WORKDIR, SandboxSpec
from execbox.sandbox.settings import DockerSettings

# Docker's own masked paths (20.10) and the ones its later releases and CIS guidance add: kernel
# state a sandbox has no use for (interrupt counts leak other tenants' activity, powercap leaks
# energy counters usable as a side channel).
MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/proc/interrupts",
    "/proc/softirqs", "/sys/devices/virtual/powercap", "/sys/devices/system/cpu/cpu0/thermal_throttle",
)  # fmt: skip

CPU_PERIOD_US = 100_000
IDLE_CPU_SHARES = 2
DEFAULT_CPU_SHARES = 1024
"""The engine's CPU weights: the lowest it accepts, and every container's default."""


def host_config_kwargs(
    spec: SandboxSpec, settings: DockerSettings, uid: int, seccomp: str, network: str | None = None
) -> dict[str, Any]:
    """Every protection of DESIGN.md's 'Every sandbox, always', as engine settings; `uid` is the
    run's own user, `seccomp` the profile's JSON, `network` the run's own egress network (None: no
    network interface but loopback)."""
    lim = spec.limits
    workspace = DriverConfig(
        "local",
        {"type": "tmpfs", "device": "tmpfs", "o": f"size={lim.disk_mb}m,uid={uid},gid={uid},mode=0755,nosuid,nodev"},
    )
    kwargs: dict[str, Any] = {
        "network_mode": network or "none",
        "read_only": True,
        # Labelled like the container, so a volume left by a container removed without its volumes
        # (by hand, say) can be found and removed.
        "mounts": [
            Mount(
                target=WORKDIR,
                source=None,
                type="volume",
                driver_config=workspace,
                labels={MANAGED_LABEL: "true", DEPLOYMENT_LABEL: spec.deployment},
            )
        ],  # fmt: skip
        "tmpfs": {"/tmp": f"size={lim.disk_mb}m,uid={uid},gid={uid},mode=1777,nosuid,nodev,noexec"},
        "shm_size": f"{min(lim.disk_mb, 64)}m",
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        # The launcher (PID 1) is one process on top of the program's `pids`; see pids_limit.
        "pids_limit": pids_limit(lim.pids, policy_runtime(spec, settings)),
        # CFS quota rather than nano_cpus: the same limit, and one `docker update` can change it.
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": int(lim.cpu * CPU_PERIOD_US),
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={seccomp}"],
        "cgroupns": "private",  # /proc/self/cgroup shows "/", not the host's path with the container id
        "oom_score_adj": settings.oom_score_adj,  # the host's OOM killer picks a sandbox before dockerd or Redis
        "ulimits": [
            Ulimit(name="nofile", soft=1024, hard=1024),
            Ulimit(name="fsize", soft=lim.disk_mb << 20, hard=lim.disk_mb << 20),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="stack", soft=8 << 20, hard=8 << 20),
            Ulimit(name="cpu", soft=lim.cpu_time_s, hard=lim.cpu_time_s + 1),
            # Per uid, and the uid is the sandbox's own: the program and the launcher, nothing else.
            # Under gVisor this is what bounds the program's processes (see pids_limit).
            Ulimit(name="nproc", soft=lim.pids + 1, hard=lim.pids + 1),
        ],
        "ipc_mode": "private",
        "privileged": False,
        "log_config": {"type": "none", "config": {}},
    }
    if network:
        # Names resolve at the proxy. The engine's resolver on an internal network answers nothing,
        # so a program's own lookups fail after 1 s instead of 10.
        kwargs["dns_opt"] = ["timeout:1", "attempts:1"]
    if spec.preloads:
        # A warm container whose preloaded interpreter imports while it waits: the lowest CPU weight
        # until a run takes it (DockerRuntime.resize gives the default back), so that its imports
        # only use CPU no run wants.
        kwargs["cpu_shares"] = IDLE_CPU_SHARES
    runtime = engine_runtime(policy_runtime(spec, settings), settings, network is not None)
    if runtime:
        kwargs["runtime"] = runtime
    return kwargs


def policy_runtime(spec: SandboxSpec, settings: DockerSettings) -> str:
    """The policy's runtime for this run (runc, runsc): the spec's, else the operator's default."""
    return spec.runtime or settings.runtime or "runc"


GVISOR_BASE_TASKS, GVISOR_TASKS_PER_TASK = 64, 6
"""Host tasks of a gVisor sandbox (ptrace platform), measured here: ~46 with one program task, then
~5.3 per program task (215 for 33, 383 for 65); with headroom."""


def pids_limit(pids: int, runtime: str | None) -> int:
    """The pids cgroup counts host tasks. Under runc those are the program's processes and threads
    plus the launcher. Under gVisor they are the sandbox kernel's own threads (it fails to start,
    or crashes, when they run out), while the program's tasks live inside it and are bounded by
    RLIMIT_NPROC; the cgroup is then sized for gVisor at the program's full `pids`."""
    if runtime == "runsc":
        return GVISOR_BASE_TASKS + GVISOR_TASKS_PER_TASK * (pids + 1)
    return pids + 1


def engine_runtime(name: str, settings: DockerSettings, networked: bool) -> str | None:
    """The engine's runtime name for a policy's runtime: gVisor is registered twice, with its own
    network stack off (no network at all) and with the run's network namespace passed through."""
    if name == "runsc" and networked:
        return settings.runsc_network_runtime
    return None if name == "runc" else name
