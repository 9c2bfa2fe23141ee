"""What a worker may ask of the Docker engine (pure logic: paths, bodies, ownership by label).

A worker that is taken over holds this socket instead of the engine's, so it can still start
sandboxes, but only hardened ones: no privileged container, no added capability, no host path,
no host namespace, no device, no root user, no unconfined seccomp or AppArmor, no image other than
a sandbox image, and only on containers and networks labelled as this deployment's. Everything
else is refused (403) before it reaches the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_VERSION = r"(?:/v1\.\d+)?"
_ID = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})"
# (method, path) -> scope: "engine" (no object), "container" or "network" (the captured id must be
# this deployment's), or a body check name.
ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, re.compile(f"^{_VERSION}{path}$"), scope)
    for method, path, scope in (
        ("GET", "/_ping", "engine"),
        ("HEAD", "/_ping", "engine"),
        ("GET", "/version", "engine"),
        ("GET", "/info", "engine"),
        ("GET", r"/images/([^?]+)/json", "engine"),
        ("GET", "/containers/json", "engine"),
        ("GET", "/networks", "engine"),
        ("POST", "/containers/create", "create"),
        ("POST", f"/containers/{_ID}/(?:start|kill|wait|pause|unpause|attach)", "container"),
        ("POST", f"/containers/{_ID}/update", "update"),
        ("GET", f"/containers/{_ID}/(?:json|stats|archive)", "container"),
        ("HEAD", f"/containers/{_ID}/archive", "container"),
        ("PUT", f"/containers/{_ID}/archive", "container"),
        ("DELETE", f"/containers/{_ID}", "container"),
        ("POST", "/networks/create", "network-create"),
        ("GET", f"/networks/{_ID}", "network"),
        ("POST", f"/networks/{_ID}/(?:connect|disconnect)", "network-connect"),
        ("DELETE", f"/networks/{_ID}", "network"),
    )
)
MANAGED, DEPLOYMENT = "execbox.managed", "execbox.deployment"
SANDBOX_IMAGES = re.compile(r"^execbox/sandbox-[a-z0-9-]+(?::[A-Za-z0-9._-]+)?$")
RUNTIMES = {None, "", "runc", "runsc", "runsc-net"}
_HOST_MODES = ("PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode")


class Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Route:
    scope: str
    object_id: str | None


def route(method: str, target: str) -> Route:
    path = target.split("?", 1)[0]
    for allowed_method, pattern, scope in ROUTES:
        found = pattern.match(path)
        if found and method == allowed_method:
            return Route(scope, found.group(1) if pattern.groups and scope != "engine" else None)
    raise Refused(f"{method} {path} is not a call execbox's workers make")


def ours(labels: dict[str, str] | None, deployment: str) -> bool:
    labels = labels or {}
    return labels.get(MANAGED) == "true" and labels.get(DEPLOYMENT) == deployment


def check_create(body: dict[str, Any], deployment: str, network_is_ours: Any) -> None:
    """A container create body must be a hardened sandbox of this deployment (raises Refused)."""
    host: dict[str, Any] = body.get("HostConfig") or {}
    image = str(body.get("Image", ""))
    if not SANDBOX_IMAGES.match(image):
        raise Refused(f"image {image!r} is not a sandbox image")
    user = str(body.get("User", ""))
    if user.split(":")[0] in ("", "0", "root"):
        raise Refused("containers must run as a non-root user")
    if not ours(body.get("Labels"), deployment):
        raise Refused("containers must carry this deployment's execbox labels")
    if host.get("Privileged"):
        raise Refused("privileged containers are refused")
    if host.get("CapAdd") or host.get("CapDrop") != ["ALL"]:
        raise Refused("containers must drop every capability and add none")
    options = [str(o) for o in host.get("SecurityOpt") or []]
    if "no-new-privileges" not in options and "no-new-privileges:true" not in options:
        raise Refused("containers must set no-new-privileges")
    if not any(o.startswith("seccomp=") and o != "seccomp=unconfined" for o in options):
        raise Refused("containers must carry execbox's seccomp profile")
    if any(o.endswith("=unconfined") or o in ("label=disable", "label:disable") for o in options):
        raise Refused("unconfined security options are refused")
    if host.get("Binds") or host.get("VolumesFrom") or host.get("Links") or host.get("Devices"):
        raise Refused("host paths, other containers' volumes, links and devices are refused")
    if host.get("DeviceRequests") or host.get("DeviceCgroupRules") or host.get("Sysctls"):
        raise Refused("devices and sysctls are refused")
    for mount in host.get("Mounts") or []:
        if mount.get("Type") not in ("volume", "tmpfs") or mount.get("Source"):
            raise Refused("only anonymous volumes and tmpfs mounts are allowed")
    for mode in _HOST_MODES:
        value = str(host.get(mode) or "")
        if value == "host" or value.startswith("container:"):
            raise Refused(f"{mode} {value!r} is refused")
    if not host.get("ReadonlyRootfs"):
        raise Refused("the root filesystem must be read-only")
    memory = int(host.get("Memory") or 0)
    if memory <= 0 or int(host.get("MemorySwap") or 0) != memory or host.get("OomKillDisable"):
        raise Refused("a memory limit equal to memory+swap is required")
    if int(host.get("PidsLimit") or 0) <= 0:
        raise Refused("a pids limit is required")
    _check_weight(host.get("CpuShares"))
    if host.get("PortBindings") or host.get("PublishAllPorts") or host.get("CgroupParent"):
        raise Refused("published ports and cgroup parents are refused")
    if host.get("Runtime") not in RUNTIMES:
        raise Refused(f"runtime {host.get('Runtime')!r} is refused")
    network = str(host.get("NetworkMode") or "none")
    if network != "none" and not network_is_ours(network):
        raise Refused(f"network {network!r} is not one of this deployment's")


_DEFAULT_CPU_SHARES = 1024
"""The engine's default CPU weight: a worker may lower a sandbox's (a waiting warm one), never raise it."""


def _check_weight(shares: Any) -> None:
    if shares and not 2 <= int(shares) <= _DEFAULT_CPU_SHARES:
        raise Refused(f"a CPU weight outside 2..{_DEFAULT_CPU_SHARES} (the default) is refused")


def check_update(body: dict[str, Any]) -> None:
    allowed = {"Memory", "MemorySwap", "CpuPeriod", "CpuQuota", "CpuShares"}
    if set(body) - allowed:
        raise Refused(f"only {', '.join(sorted(allowed))} may be updated")
    if "Memory" in body and int(body.get("MemorySwap") or 0) != int(body["Memory"]):
        raise Refused("memory must stay equal to memory+swap")
    _check_weight(body.get("CpuShares"))


def check_network_create(body: dict[str, Any], deployment: str) -> None:
    if (
        not body.get("Internal")
        or body.get("Driver") not in (None, "bridge")
        or not ours(body.get("Labels"), deployment)
    ):
        raise Refused("only internal bridge networks labelled as this deployment's may be created")
    if (body.get("Options") or {}).get("com.docker.network.bridge.inhibit_ipv4") != "true":
        raise Refused("per-run networks give the host no address (inhibit_ipv4)")


def check_connect(body: dict[str, Any], egress_container: str) -> None:
    if str(body.get("Container", "")) != egress_container:
        raise Refused("only the egress proxy may be connected to or disconnected from a run's network")


__all__ = ["ROUTES", "Refused", "Route", "check_connect", "check_create", "check_network_create",
           "check_update", "ours", "route"]  # fmt: skip
