"""What a sandbox container of this deployment may be: the bounds the proxy compares bodies against.

Built from the same settings and files the workers read (EXECBOX_POLICIES_DIR's policies and seccomp
profile, EXECBOX_DOCKER__UID_RANGE, EXECBOX_DOCKER__OOM_SCORE_ADJ, EXECBOX_DOCKER__RUNSC_NETWORK_RUNTIME,
EXECBOX_EGRESS__SUBNET_POOL),
so the proxy and the workers agree by construction when they share the deployment's environment.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from execbox.catalog.policies import PolicySet
from execbox.sandbox.docker.hostconfig import pids_limit
from execbox.sandbox.seccomp import SeccompProfiles
from execbox.sandbox.settings import DockerSettings
from execbox.sandbox.uids import parse_range


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Shape:
    uids: range
    """The sandbox uid range: a container's user and group are both in it."""
    oom_score_adj: int
    """The workers' OOM score adjustment: a sandbox's may be higher (killed sooner), never lower."""
    memory_mb: int
    cpu: float
    cpu_time_s: int
    pids: int
    disk_mb: int
    """The highest ceilings over every policy: no sandbox is given more."""
    seccomp_digests: frozenset[str]
    """SHA-256 of each seccomp profile a worker makes (every policy's narrowing, for runc and gVisor)."""
    gvisor_runtimes: frozenset[str]
    """The engine's names for gVisor (its pids cgroup is sized for gVisor's own threads)."""
    subnet_pool: ipaddress.IPv4Network | ipaddress.IPv6Network
    """Where per-run networks and the egress proxy's addresses on them come from (EXECBOX_EGRESS__SUBNET_POOL)."""

    @property
    def runtimes(self) -> frozenset[str]:
        return frozenset({"runc", *self.gvisor_runtimes})

    def max_pids_limit(self, runtime: str | None) -> int:
        return pids_limit(self.pids, "runsc" if runtime in self.gvisor_runtimes else runtime)


def shape_from(docker: DockerSettings, policies_dir: Path, subnet_pool: str) -> Shape:
    """The shape of this deployment's sandboxes (raises when the policies or the profile are unusable:
    a proxy that cannot bound bodies must not start)."""
    policies = PolicySet.load(policies_dir)
    profiles = SeccompProfiles(docker.seccomp_profile or policies_dir / "seccomp.json")
    digests = {
        digest(profiles.json(deny, gvisor=gvisor)) for deny in policies.seccomp_denies() for gvisor in (False, True)
    }
    return Shape(
        uids=parse_range(docker.uid_range),
        oom_score_adj=docker.oom_score_adj,
        memory_mb=int(policies.highest_ceiling("memory_mb")),
        cpu=policies.highest_ceiling("cpu"),
        cpu_time_s=int(policies.highest_ceiling("cpu_time_s")),
        pids=int(policies.highest_ceiling("pids")),
        disk_mb=int(policies.highest_ceiling("disk_mb")),
        seccomp_digests=frozenset(digests),
        gvisor_runtimes=frozenset({"runsc", docker.runsc_network_runtime}),
        subnet_pool=ipaddress.ip_network(subnet_pool),
    )


__all__ = ["Shape", "digest", "shape_from"]
