"""The one container shape a worker makes, as an allow list: create and update bodies are compared
field by field against what execbox.sandbox.docker (hostconfig, runtime) sends, bounded by the
deployment's Shape; any other field, value or spelling is refused naming the field.

Unknown fields are refused whatever their value: the engine decodes names case-insensitively and
gains fields with every release, so only names known here, spelled exactly, pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from execbox.dockerproxy.rules import SANDBOX_IMAGES, Refused, booleans, fields, ours
from execbox.dockerproxy.shape import Shape, digest
from execbox.sandbox.docker.hostconfig import CPU_PERIOD_US, DEFAULT_CPU_SHARES, IDLE_CPU_SHARES
from execbox.sandbox.runtime import WORKDIR

MIB = 1 << 20
DOCKER_MASKED_PATHS = frozenset({
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/proc/interrupts",
    "/sys/devices/virtual/powercap",
})  # fmt: skip
"""The engine's own masked paths (20.10's, and what 25 added): a list given must hold them all."""
DOCKER_READONLY_PATHS = frozenset({"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"})
NOFILE, STACK_BYTES, SHM_MB = 1024, 8 << 20, 64
"""As hostconfig sets them: open files, stack, and /dev/shm at most min(disk, 64 MiB)."""

_TOP = {"Hostname", "User", "Tty", "OpenStdin", "StdinOnce", "AttachStdin", "AttachStdout", "AttachStderr", "Env",
        "Cmd", "Image", "NetworkDisabled", "WorkingDir", "HostConfig", "Labels"}  # fmt: skip
_HOST = {"Memory", "MemorySwap", "NanoCpus", "ShmSize", "IpcMode", "OomScoreAdj", "ReadonlyRootfs", "NetworkMode",
         "CapDrop", "CapAdd", "Privileged", "DnsOptions", "SecurityOpt", "Ulimits", "LogConfig", "CpuQuota",
         "CpuPeriod", "CpuShares", "Tmpfs", "PidsLimit", "Runtime", "Mounts", "CgroupnsMode", "MaskedPaths",
         "ReadonlyPaths"}  # fmt: skip
_HOST_REQUIRED = {"Memory", "MemorySwap", "PidsLimit", "CpuPeriod", "CpuQuota", "OomScoreAdj", "ReadonlyRootfs",
                  "CapDrop", "SecurityOpt", "Ulimits", "NetworkMode", "CgroupnsMode", "LogConfig"}  # fmt: skip
_UPDATE = {"Memory", "MemorySwap", "CpuPeriod", "CpuQuota", "CpuShares"}
_ULIMITS = ("nofile", "fsize", "core", "stack", "cpu", "nproc")
_ID_NUMBER = re.compile(r"[1-9][0-9]{0,9}")
"""Decimal digits only: no sign, no leading zero, no space, no other script's digits (fullmatch)."""
_DNS_OPTION = re.compile(r"(?:timeout|attempts):[1-9][0-9]?")


def check_create(body: Any, deployment: str, network_is_ours: Callable[[str], bool], shape: Shape) -> None:
    """A container create body must be the runtime's sandbox shape, within the shape's bounds."""
    fields(body, "", _TOP, {"User", "Image", "HostConfig", "Labels"})
    image = body["Image"]
    if not isinstance(image, str) or not SANDBOX_IMAGES.fullmatch(image):
        raise Refused("Image", f"{image!r} is not a sandbox image (execbox/sandbox-<name>[:<tag>])")
    uid = _user(body["User"], shape)
    if not _strings(body["Labels"], mapping=True) or not ours(body["Labels"], deployment):
        raise Refused("Labels", f"containers carry execbox.managed=true and execbox.deployment={deployment}")
    booleans(body, "", ("Tty", "OpenStdin", "StdinOnce", "AttachStdin", "AttachStdout", "AttachStderr",
                        "NetworkDisabled"))  # fmt: skip
    for name in ("Hostname", "WorkingDir"):
        if name in body and not isinstance(body[name], str):
            raise Refused(name, "must be a string")
    for name in ("Env", "Cmd"):
        if name in body and not _strings(body[name]):
            raise Refused(name, "must be a list of strings")
    _host(body["HostConfig"], uid, network_is_ours, shape)


def check_update(body: Any, shape: Shape) -> None:
    """A running sandbox's memory and CPU may change (a warm container resized for its run), within bounds."""
    fields(body, "", _UPDATE, set())
    if "Memory" in body or "MemorySwap" in body:
        _memory(body, "", shape)
    if "CpuQuota" in body or "CpuPeriod" in body:
        _cpu_quota(body, "", shape)
    if "CpuShares" in body:
        _number(body["CpuShares"], "CpuShares", IDLE_CPU_SHARES, DEFAULT_CPU_SHARES, "the engine's default weight")


def _host(host: Any, uid: int, network_is_ours: Callable[[str], bool], shape: Shape) -> None:
    fields(host, "HostConfig", _HOST, _HOST_REQUIRED)
    runtime = host.get("Runtime")
    if runtime not in (None, "", *shape.runtimes):
        raise Refused("HostConfig.Runtime", f"{runtime!r} is not one of {', '.join(sorted(shape.runtimes))}")
    _equal(host, "Privileged", False, required=False)
    _equal(host, "ReadonlyRootfs", True)
    _equal(host, "CapDrop", ["ALL"])
    if host.get("CapAdd") not in (None, []):
        raise Refused("HostConfig.CapAdd", "no capability is added to a sandbox")
    _security(host["SecurityOpt"], shape)
    _paths(host, "MaskedPaths", DOCKER_MASKED_PATHS)
    _paths(host, "ReadonlyPaths", DOCKER_READONLY_PATHS)
    if host.get("IpcMode", "private") not in ("private", "none"):
        raise Refused("HostConfig.IpcMode", "must be private (or none)")
    _equal(host, "CgroupnsMode", "private")
    network = host["NetworkMode"]
    if not isinstance(network, str) or (network != "none" and not network_is_ours(network)):
        raise Refused("HostConfig.NetworkMode", f"{network!r} is neither none nor one of this deployment's networks")
    if "DnsOptions" in host and not (
        _strings(host["DnsOptions"]) and all(_DNS_OPTION.fullmatch(o) for o in host["DnsOptions"])
    ):
        raise Refused("HostConfig.DnsOptions", "only timeout:N and attempts:N")
    if host["LogConfig"] not in ({"Type": "none"}, {"Type": "none", "Config": {}}, {"Type": "none", "Config": None}):
        raise Refused("HostConfig.LogConfig", 'must be {"Type": "none"}: the engine keeps no sandbox output')
    _memory(host, "HostConfig.", shape)
    _number(host["PidsLimit"], "HostConfig.PidsLimit", 1, shape.max_pids_limit(runtime), "the pids ceiling's")
    _cpu_quota(host, "HostConfig.", shape)
    if "NanoCpus" in host:
        _number(host["NanoCpus"], "HostConfig.NanoCpus", 1, int(shape.cpu * 10**9), "the cpu ceiling's")
    if "CpuShares" in host:
        _number(host["CpuShares"], "HostConfig.CpuShares", IDLE_CPU_SHARES, DEFAULT_CPU_SHARES, "the default weight")
    _number(host["OomScoreAdj"], "HostConfig.OomScoreAdj", shape.oom_score_adj, 1000, "the workers' own or higher")
    if "ShmSize" in host:
        _number(host["ShmSize"], "HostConfig.ShmSize", 1, min(shape.disk_mb, SHM_MB) * MIB, "min(disk ceiling, 64 MiB)")
    _ulimits(host["Ulimits"], shape)
    _tmpfs(host.get("Tmpfs"), uid, shape)
    _mounts(host.get("Mounts"), uid, shape)


def _user(user: Any, shape: Shape) -> int:
    """`uid:gid`, both decimal and in the sandbox range, and equal (the runtime gives each sandbox
    one id for both); returns the uid."""
    uid, _, gid = user.partition(":") if isinstance(user, str) else ("", "", "")
    if not (_ID_NUMBER.fullmatch(uid) and _ID_NUMBER.fullmatch(gid)):
        raise Refused("User", f"{user!r} is not uid:gid in decimal digits (no sign, no leading zero)")
    if int(uid) not in shape.uids or int(gid) != int(uid):
        raise Refused("User", f"{user!r}: uid and gid are one id of the sandbox range "
                      f"{shape.uids.start}-{shape.uids.stop - 1}")  # fmt: skip
    return int(uid)


def _security(options: Any, shape: Shape) -> None:
    """Exactly no-new-privileges and one seccomp profile a worker makes (by digest); no other option,
    no second seccomp (a later one, in either spelling, would replace the first), no AppArmor or label."""
    if not _strings(options) or len(options) != 2:
        raise Refused("HostConfig.SecurityOpt", "is exactly no-new-privileges and seccomp=<execbox's profile>")
    seen: set[str] = set()
    for i, option in enumerate(options):
        field = f"HostConfig.SecurityOpt[{i}]"
        if option == "no-new-privileges" and "nnp" not in seen:
            seen.add("nnp")
        elif option.startswith("seccomp=") and "seccomp" not in seen:
            if digest(option.removeprefix("seccomp=")) not in shape.seccomp_digests:
                raise Refused(field, "is not a seccomp profile this deployment's workers make (compared by digest)")
            seen.add("seccomp")
        else:
            raise Refused(field, f"{option[:40]!r} is not no-new-privileges or execbox's seccomp profile")


def _paths(host: Mapping[str, Any], name: str, defaults: frozenset[str]) -> None:
    """Absent (the engine's defaults) or a list holding every default (stricter is fine)."""
    paths = host.get(name)
    if paths is None:
        return
    if not _strings(paths) or defaults - set(paths):
        missing = ", ".join(sorted(defaults - set(paths))) if _strings(paths) else "a list of paths"
        raise Refused(f"HostConfig.{name}", f"must hold the engine's defaults (missing: {missing}) or be left out")


def _memory(body: Mapping[str, Any], prefix: str, shape: Shape) -> None:
    _number(body.get("Memory"), f"{prefix}Memory", 4 * MIB, shape.memory_mb * MIB, "the memory ceiling's")
    if body.get("MemorySwap") != body["Memory"]:
        raise Refused(f"{prefix}MemorySwap", "must equal Memory (no swap beyond the memory limit)")


def _cpu_quota(body: Mapping[str, Any], prefix: str, shape: Shape) -> None:
    if body.get("CpuPeriod") != CPU_PERIOD_US:
        raise Refused(f"{prefix}CpuPeriod", f"must be {CPU_PERIOD_US} (with CpuQuota)")
    _number(body.get("CpuQuota"), f"{prefix}CpuQuota", 1000, int(shape.cpu * CPU_PERIOD_US), "the cpu ceiling's")


def _ulimits(ulimits: Any, shape: Shape) -> None:
    bounds = {
        "nofile": (NOFILE, NOFILE),
        "fsize": (shape.disk_mb * MIB, shape.disk_mb * MIB),
        "core": (0, 0),
        "stack": (STACK_BYTES, STACK_BYTES),
        "cpu": (shape.cpu_time_s, shape.cpu_time_s + 1),
        "nproc": (shape.pids + 1, shape.pids + 1),
    }
    if not isinstance(ulimits, list):
        raise Refused("HostConfig.Ulimits", f"must be a list giving each of {', '.join(_ULIMITS)}")
    seen = set()
    for i, ulimit in enumerate(ulimits):
        field = f"HostConfig.Ulimits[{i}]"
        fields(ulimit, field, {"Name", "Soft", "Hard"}, {"Name", "Soft", "Hard"})
        name = ulimit["Name"]
        if name not in bounds or name in seen:
            raise Refused(f"{field}.Name", f"{name!r} is not one of {', '.join(_ULIMITS)} (each once)")
        seen.add(name)
        soft, hard = bounds[name]
        _number(ulimit["Hard"], f"{field}.Hard", 0, hard, f"{name}'s ceiling")
        _number(ulimit["Soft"], f"{field}.Soft", 0, min(soft, ulimit["Hard"]), f"{name}'s ceiling and Hard")
    if missing := [name for name in _ULIMITS if name not in seen]:
        raise Refused("HostConfig.Ulimits", f"must also give {', '.join(missing)}")


def _tmpfs(tmpfs: Any, uid: int, shape: Shape) -> None:
    if tmpfs is None:
        return
    if not _strings(tmpfs, mapping=True) or set(tmpfs) - {"/tmp"}:
        raise Refused("HostConfig.Tmpfs", "only /tmp, as a string of options")
    for target, options in tmpfs.items():
        _tmpfs_options(options, f"HostConfig.Tmpfs[{target}]", uid, shape)


def _mounts(mounts: Any, uid: int, shape: Shape) -> None:
    """At most the workspace: an anonymous volume at /workspace, of the local driver as a sized tmpfs."""
    if mounts is None:
        return
    if not isinstance(mounts, list) or len(mounts) > 1:
        raise Refused("HostConfig.Mounts", f"holds at most the workspace volume at {WORKDIR}")
    for i, mount in enumerate(mounts):
        field = f"HostConfig.Mounts[{i}]"
        fields(mount, field, {"Target", "Source", "Type", "ReadOnly", "VolumeOptions"}, {"Target", "Type"})
        _equal(mount, "Type", "volume", where=field)
        _equal(mount, "Target", WORKDIR, where=field)
        if mount.get("Source") not in (None, ""):
            raise Refused(f"{field}.Source", "volumes are anonymous (no source)")
        booleans(mount, field, ("ReadOnly",))
        volume = mount.get("VolumeOptions")
        if volume is None:
            continue
        fields(volume, f"{field}.VolumeOptions", {"Labels", "DriverConfig", "NoCopy"}, set())
        if volume.get("Labels") is not None and not _strings(volume["Labels"], mapping=True):
            raise Refused(f"{field}.VolumeOptions.Labels", "must map strings to strings")
        booleans(volume, f"{field}.VolumeOptions", ("NoCopy",))
        driver = volume.get("DriverConfig")
        if driver is None:
            continue
        where = f"{field}.VolumeOptions.DriverConfig"
        fields(driver, where, {"Name", "Options"}, {"Name"})
        _equal(driver, "Name", "local", where=where)
        options = driver.get("Options")
        if options in (None, {}):
            continue
        # The local driver mounts `device` as `type` with `o`: only a tmpfs (a bind or a block device
        # would be the host's).
        if not _strings(options, mapping=True) or set(options) != {"type", "device", "o"}:
            raise Refused(f"{where}.Options", "only type=tmpfs, device=tmpfs and o=<tmpfs options>")
        _equal(options, "type", "tmpfs", where=f"{where}.Options")
        _equal(options, "device", "tmpfs", where=f"{where}.Options")
        _tmpfs_options(options["o"], f"{where}.Options.o", uid, shape)


def _tmpfs_options(options: str, field: str, uid: int, shape: Shape) -> None:
    """size (at most the disk ceiling), uid and gid (the container's), mode, and nosuid and nodev; noexec allowed."""
    given: dict[str, str] = {}
    for option in options.split(","):
        name, _, value = option.partition("=")
        if name in given or name not in {"size", "uid", "gid", "mode", "nosuid", "nodev", "noexec"}:
            raise Refused(field, f"{option!r} is not one of size, uid, gid, mode, nosuid, nodev, noexec (each once)")
        if (name in ("nosuid", "nodev", "noexec")) != (value == "" and "=" not in option):
            raise Refused(field, f"{option!r} is malformed")
        given[name] = value
    if missing := {"size", "nosuid", "nodev"} - set(given):
        raise Refused(field, f"must give {', '.join(sorted(missing))}")
    size = re.fullmatch(r"([1-9][0-9]{0,12})([kmg]?)", given["size"])
    scale = {"": 1, "k": 1 << 10, "m": MIB, "g": 1 << 30}
    if size is None or int(size.group(1)) * scale[size.group(2)] > shape.disk_mb * MIB:
        raise Refused(field, f"size={given['size']} is not a size up to the disk ceiling ({shape.disk_mb}m)")
    for name in ("uid", "gid"):
        if name in given and given[name] != str(uid):
            raise Refused(field, f"{name}={given[name]} is not the container's user ({uid})")
    if "mode" in given and not re.fullmatch(r"[0-7]{3,4}", given["mode"]):
        raise Refused(field, f"mode={given['mode']} is not an octal mode")


def _equal(obj: Mapping[str, Any], name: str, wanted: Any, where: str = "HostConfig", required: bool = True) -> None:
    value = obj.get(name)
    if (name in obj or required) and (type(value) is not type(wanted) or value != wanted):
        raise Refused(f"{where}.{name}", f"must be {wanted!r}")


def _number(value: Any, field: str, low: int, high: int, what: str) -> None:
    if type(value) is not int or not low <= value <= high:
        raise Refused(field, f"{value!r} is outside {low}..{high} ({what}); workers never ask for more")


def _strings(value: Any, mapping: bool = False) -> bool:
    if mapping:
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


__all__ = ["DOCKER_MASKED_PATHS", "DOCKER_READONLY_PATHS", "check_create", "check_update"]
