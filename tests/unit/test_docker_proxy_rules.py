"""The docker proxy's allow list (issue 44, item 1; control C48), from a compromised worker's side.

Every body here starts as one the real runtime builds: execbox.sandbox.docker's DockerRuntime, with
the docker SDK encoding its calls, sends them to a transport that records the exact bytes instead
of reaching an engine. Those bodies must pass (the allow list cannot drift from the runtime); each
hostile change of one must be refused, naming the field.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import pytest
import requests
from requests.adapters import BaseAdapter

from execbox.dockerproxy import containers, networks, rules
from execbox.dockerproxy.shape import Shape, shape_from
from execbox.sandbox.docker.engine import listed_containers, listed_networks
from execbox.sandbox.docker.networks import EgressNetwork, EgressNetworks
from execbox.sandbox.docker.runtime import DockerRuntime
from execbox.sandbox.runtime import SESSION_LABEL, EgressSpec, Limits, SandboxSpec
from execbox.sandbox.settings import DockerSettings
from tests.conftest import ROOT

DEPLOYMENT = "execbox"
SUBNET_POOL = "10.213.0.0/16"
NETWORK = "net-of-this-run"
GIB = 1 << 30


class Recorder(BaseAdapter):
    """The engine's end of the SDK's transport: records each request, answers what the SDK expects."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        path = urlsplit(request.url or "").path
        answer = requests.Response()
        answer.status_code = 201 if path.endswith("/create") else 200
        answer._content = b"[]" if path.endswith(("/containers/json", "/networks")) else b'{"Id": "c0ffee"}'
        answer.request = request
        return answer

    def close(self) -> None:
        pass

    def calls(self) -> list[tuple[str, str, str, Any]]:
        """(method, path, query, body) of each call, the body decoded as the proxy decodes it."""
        found = []
        for request in self.sent:
            url = urlsplit(request.url or "")
            body = request.body.encode() if isinstance(request.body, str) else request.body
            found.append((request.method or "", url.path, url.query, rules.decode(body) if body else None))
        return found


class RecordedRuntime(DockerRuntime):
    """The real runtime, its engine replaced by the recorder (an SDK client that never connects)."""

    def __init__(self, settings: DockerSettings, policies_dir: Path) -> None:
        super().__init__(settings, policies_dir=policies_dir)
        self.recorder = Recorder()
        self._recorded = docker.APIClient(base_url="unix:///nonexistent", version="1.44")
        self._recorded.mount("http+docker://", self.recorder)

    @property
    def api(self) -> docker.APIClient:
        return self._recorded


def _spec(limits: Limits, **changes: Any) -> SandboxSpec:
    base = SandboxSpec(
        "exe_1", "trace", "worker-1", "execbox/sandbox-python:latest", ("python3", "main.py"), (), (), limits,
        language="python", deployment=DEPLOYMENT,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


DEFAULT = Limits(timeout_s=10, cpu=1.0, cpu_time_s=20, memory_mb=256, pids=64, disk_mb=64, output_bytes=1 << 20)
LARGEST = Limits(timeout_s=900, cpu=2.0, cpu_time_s=1800, memory_mb=8192, pids=256, disk_mb=2048, output_bytes=1 << 23)
"""The highest ceiling of each limit over the shipped policies (policies/large.yaml and default.yaml)."""


def _policies(directory: Path) -> Path:
    """The shipped policies plus one that narrows the seccomp profile (a second profile digest)."""
    directory.mkdir()
    for path in (ROOT / "policies").iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    (directory / "narrow.yaml").write_text("seccomp_deny: [ptrace, personality]\n")
    return directory


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _policies(tmp_path_factory.mktemp("proxy") / "policies")


@pytest.fixture(scope="module")
def shape(policies: Path) -> Shape:
    return shape_from(DockerSettings(), policies, SUBNET_POOL)


@pytest.fixture
def runtime(policies: Path) -> RecordedRuntime:
    return RecordedRuntime(DockerSettings(), policies)


@pytest.fixture(scope="module")
def one_shot(policies: Path) -> dict[str, Any]:
    """A one-shot run's create body, as the runtime sends it (each test changes a copy)."""
    return _created(RecordedRuntime(DockerSettings(), policies), lambda r: r.create(_spec(DEFAULT)))[0]


def _network_is_ours(name: str) -> bool:
    return name == NETWORK


def _egress() -> EgressNetwork:
    return EgressNetwork(NETWORK, "10.9.0.2", "execbox-egress")


def _created(runtime: RecordedRuntime, make: Callable[[RecordedRuntime], object]) -> list[dict[str, Any]]:
    make(runtime)
    return [body for method, path, _, body in runtime.recorder.calls() if path.endswith("/containers/create")]


MAKERS: dict[str, Callable[[RecordedRuntime], object]] = {
    "one-shot runc": lambda r: r.create(_spec(DEFAULT)),
    "one-shot runc with network": lambda r: r.create(_spec(DEFAULT), _egress()),
    "one-shot runsc": lambda r: r.create(_spec(DEFAULT, runtime="runsc")),
    "one-shot runsc with network": lambda r: r.create(_spec(DEFAULT, runtime="runsc"), _egress()),
    "one-shot at every ceiling": lambda r: r.create(_spec(LARGEST)),
    "one-shot runsc at every ceiling": lambda r: r.create(_spec(LARGEST, runtime="runsc"), _egress()),
    "narrowed seccomp profile": lambda r: r.create(_spec(DEFAULT, seccomp_deny=("personality", "ptrace"))),
    "narrowed seccomp profile, runsc": lambda r: r.create(
        _spec(DEFAULT, runtime="runsc", seccomp_deny=("personality", "ptrace"))
    ),
    "warm pool, preloading": lambda r: r.create_pooled(_spec(DEFAULT, container_env=(("PRELOAD", "1"),)), "python"),
    "warm pool, plain": lambda r: r.create_pooled(_spec(DEFAULT), "python@slim"),
    "session": lambda r: r.create_labelled(
        _spec(DEFAULT, execution_id="", runtime="runc"), r.labels(_spec(DEFAULT), {SESSION_LABEL: "ses_1"})
    ),
}


@pytest.mark.parametrize("case", list(MAKERS))
def test_every_body_the_runtime_builds_is_accepted(runtime: RecordedRuntime, shape: Shape, case: str) -> None:
    bodies = _created(runtime, MAKERS[case])
    assert len(bodies) == 1
    containers.check_create(bodies[0], DEPLOYMENT, _network_is_ours, shape)


def test_every_other_call_the_runtime_makes_is_accepted(runtime: RecordedRuntime, shape: Shape) -> None:
    """The warm pool's resize and weight, its listings of containers and networks, an image's id."""
    runtime.resize("c0ffee", DEFAULT, dataclasses.replace(LARGEST), full_weight=True)
    runtime.resize("c0ffee", DEFAULT, dataclasses.replace(DEFAULT, memory_mb=512, cpu=0.5))
    listed_containers(runtime.api, DEPLOYMENT)
    listed_networks(runtime.api, DEPLOYMENT)
    runtime.image_id("execbox/sandbox-python:latest")
    calls = runtime.recorder.calls()
    assert [rules.route(method, path).scope for method, path, _, _ in calls] == [
        "update", "update", "listing", "listing", "image"
    ]  # fmt: skip
    for method, path, query, body in calls:
        route = rules.route(method, path)
        if route.scope == "update":
            containers.check_update(body, shape)
        elif route.scope == "listing":
            rules.check_listing(query, DEPLOYMENT)
        else:
            rules.check_image(route.object_id or "")


# -- hostile bodies ----------------------------------------------------------------------------------

Body = dict[str, Any]


def _set(path: str, value: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        *parents, last = path.split(".")
        for part in parents:
            body = body[part]
        body[last] = value

    return change


def _drop(path: str) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        *parents, last = path.split(".")
        for part in parents:
            body = body[part]
        del body[last]

    return change


def _security_opt(*extra: str, seccomp: str | None = None) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        options = body["HostConfig"]["SecurityOpt"]
        if seccomp is not None:
            options[1] = f"seccomp={seccomp}"
        options.extend(extra)

    return change


def _ulimit(name: str, soft: int, hard: int) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        for ulimit in body["HostConfig"]["Ulimits"]:
            if ulimit["Name"] == name:
                ulimit.update(Soft=soft, Hard=hard)

    return change


def _workspace_driver(options: dict[str, str]) -> Callable[[Body], None]:
    return _set_mount("VolumeOptions", {"DriverConfig": {"Name": "local", "Options": options}})


def _workspace_tmpfs(o: str) -> Callable[[Body], None]:
    return _workspace_driver({"type": "tmpfs", "device": "tmpfs", "o": o})


_DRIVER_OPTIONS = "HostConfig.Mounts[0].VolumeOptions.DriverConfig.Options"


def _set_mount(key: str, value: Any) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["HostConfig"]["Mounts"][0][key] = value

    return change


def _add_mount(mount: dict[str, Any]) -> Callable[[Body], None]:
    def change(body: Body) -> None:
        body["HostConfig"]["Mounts"].append(mount)

    return change


HOST_BIND = {"type": "none", "o": "bind", "device": "/etc"}
HOSTILE: dict[str, tuple[Callable[[Body], None], str]] = {
    # uid 0 spelled so that a string comparison misses it
    **{
        f"user {user!r}": (_set("User", user), "User")
        for user in (
            "00",
            "+0",
            "-0",
            "0000",
            "00:00",
            " 0",
            "0 ",
            "0\n",
            "1000:0",
            "0:200000",
            "root",
            "",
            "0",
            "200000",
            "200000:0",
            "200000:00",
            "200000:200001",
            "0200000:0200000",
            "+200000:200000",
            "200000:200000\n",
            "٢٠٠٠٠٠:٢٠٠٠٠٠",
            "99999:99999",
            "300000:300000",
            "200000:200000:0",
        )
    },  # fmt: skip
    "user as a number": (_set("User", 200000), "User"),
    # /proc/sys writable with the engine's read-only and masked paths emptied
    "ReadonlyPaths emptied": (_set("HostConfig.ReadonlyPaths", []), "HostConfig.ReadonlyPaths"),
    "ReadonlyPaths without /proc/sys": (
        _set("HostConfig.ReadonlyPaths", ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sysrq-trigger"]),
        "HostConfig.ReadonlyPaths",
    ),
    "MaskedPaths emptied": (_set("HostConfig.MaskedPaths", []), "HostConfig.MaskedPaths"),
    "MaskedPaths without /proc/kcore": (
        lambda b: b["HostConfig"]["MaskedPaths"].remove("/proc/kcore"),
        "HostConfig.MaskedPaths",
    ),
    # host directories through the local volume driver
    "workspace volume binding a host path": (
        _workspace_driver(HOST_BIND),
        f"{_DRIVER_OPTIONS}.type",
    ),
    "workspace volume as a tmpfs with bind in o": (
        _workspace_tmpfs("size=64m,nosuid,nodev,bind"),
        f"{_DRIVER_OPTIONS}.o",
    ),
    "workspace volume of a block device": (
        _workspace_driver({"type": "ext4", "device": "/dev/sda1", "o": "size=64m,nosuid,nodev"}),
        f"{_DRIVER_OPTIONS}.type",
    ),
    "workspace volume without nosuid": (_workspace_tmpfs("size=64m,nodev"), f"{_DRIVER_OPTIONS}.o"),
    "workspace volume above the disk ceiling": (_workspace_tmpfs("size=64g,nosuid,nodev"), f"{_DRIVER_OPTIONS}.o"),
    "workspace volume of another driver": (
        _set_mount("VolumeOptions", {"DriverConfig": {"Name": "nfs"}}),
        "HostConfig.Mounts[0].VolumeOptions.DriverConfig.Name",
    ),
    "named volume": (_set_mount("Source", "execbox-redis-data"), "HostConfig.Mounts[0].Source"),
    "bind mount": (_set_mount("Type", "bind"), "HostConfig.Mounts[0].Type"),
    "second volume over /etc": (
        _add_mount({"Target": "/etc", "Type": "volume"}),
        "HostConfig.Mounts",
    ),
    "BindOptions on the workspace": (
        _set_mount("BindOptions", {"Propagation": "rshared"}),
        "HostConfig.Mounts[0].BindOptions",
    ),
    "Tmpfs without nodev": (
        _set("HostConfig.Tmpfs", {"/tmp": "size=64m,nosuid"}),
        "HostConfig.Tmpfs[/tmp]",
    ),
    "Tmpfs without a size": (_set("HostConfig.Tmpfs", {"/tmp": "nosuid,nodev"}), "HostConfig.Tmpfs[/tmp]"),
    "Tmpfs with exec": (_set("HostConfig.Tmpfs", {"/tmp": "size=64m,nosuid,nodev,exec"}), "HostConfig.Tmpfs[/tmp]"),
    "Tmpfs over /proc": (_set("HostConfig.Tmpfs", {"/proc": "size=64m,nosuid,nodev"}), "HostConfig.Tmpfs"),
    # seccomp: any profile, a second one, other spellings
    "seccomp profile allowing everything": (
        _security_opt(seccomp='{"defaultAction":"SCMP_ACT_ALLOW"}'),
        "HostConfig.SecurityOpt[1]",
    ),
    "valid seccomp then seccomp:unconfined": (_security_opt("seccomp:unconfined"), "HostConfig.SecurityOpt"),
    "seccomp=unconfined": (_security_opt(seccomp="unconfined"), "HostConfig.SecurityOpt[1]"),
    "seccomp:unconfined instead": (
        _set("HostConfig.SecurityOpt", ["no-new-privileges", "seccomp:unconfined"]),
        "HostConfig.SecurityOpt[1]",
    ),
    "apparmor=unconfined": (
        _set("HostConfig.SecurityOpt", ["no-new-privileges", "apparmor=unconfined"]),
        "HostConfig.SecurityOpt[1]",
    ),
    "label=disable": (
        _set("HostConfig.SecurityOpt", ["label=disable", "no-new-privileges"]),
        "HostConfig.SecurityOpt[0]",
    ),
    "systempaths=unconfined": (
        _set("HostConfig.SecurityOpt", ["systempaths=unconfined", "no-new-privileges"]),
        "HostConfig.SecurityOpt[0]",
    ),
    "no-new-privileges:false": (
        lambda b: b["HostConfig"]["SecurityOpt"].__setitem__(0, "no-new-privileges:false"),
        "HostConfig.SecurityOpt[0]",
    ),
    "no-new-privileges twice, no seccomp": (
        _set("HostConfig.SecurityOpt", ["no-new-privileges", "no-new-privileges"]),
        "HostConfig.SecurityOpt[1]",
    ),
    "no SecurityOpt": (_drop("HostConfig.SecurityOpt"), "HostConfig.SecurityOpt"),
    # no upper bounds
    "Memory 64 GiB": (lambda b: b["HostConfig"].update(Memory=64 * GIB, MemorySwap=64 * GIB), "HostConfig.Memory"),
    "unlimited swap": (_set("HostConfig.MemorySwap", -1), "HostConfig.MemorySwap"),
    "no memory limit": (lambda b: b["HostConfig"].update(Memory=0, MemorySwap=0), "HostConfig.Memory"),
    "OomScoreAdj -1000": (_set("HostConfig.OomScoreAdj", -1000), "HostConfig.OomScoreAdj"),
    "OomScoreAdj below the workers'": (_set("HostConfig.OomScoreAdj", 999), "HostConfig.OomScoreAdj"),
    "PidsLimit 100000": (_set("HostConfig.PidsLimit", 100_000), "HostConfig.PidsLimit"),
    "PidsLimit unlimited": (_set("HostConfig.PidsLimit", -1), "HostConfig.PidsLimit"),
    "runc with gVisor's pids limit": (_set("HostConfig.PidsLimit", 1606), "HostConfig.PidsLimit"),
    "ShmSize 32 GiB": (_set("HostConfig.ShmSize", 32 * GIB), "HostConfig.ShmSize"),
    "no CPU quota": (_drop("HostConfig.CpuQuota"), "HostConfig.CpuQuota"),
    "unlimited CPU quota": (_set("HostConfig.CpuQuota", -1), "HostConfig.CpuQuota"),
    "CPU quota of 64 CPUs": (_set("HostConfig.CpuQuota", 64 * 100_000), "HostConfig.CpuQuota"),
    "short CPU period": (_set("HostConfig.CpuPeriod", 1000), "HostConfig.CpuPeriod"),
    "NanoCpus of 64 CPUs": (_set("HostConfig.NanoCpus", 64 * 10**9), "HostConfig.NanoCpus"),
    "CPU weight above the default": (_set("HostConfig.CpuShares", 262_144), "HostConfig.CpuShares"),
    "memory as a float": (lambda b: b["HostConfig"].update(Memory=2.5e8, MemorySwap=2.5e8), "HostConfig.Memory"),
    "nofile unlimited": (_ulimit("nofile", -1, -1), "HostConfig.Ulimits[0].Hard"),
    "nproc 100000": (_ulimit("nproc", 100_000, 100_000), "HostConfig.Ulimits[5].Hard"),
    "core dumps": (_ulimit("core", 1 << 30, 1 << 30), "HostConfig.Ulimits[2].Hard"),
    "fsize 1 TiB": (_ulimit("fsize", 1 << 40, 1 << 40), "HostConfig.Ulimits[1].Hard"),
    "cpu time a day": (_ulimit("cpu", 86_400, 86_400), "HostConfig.Ulimits[4].Hard"),
    "soft above hard": (_ulimit("nofile", 1024, 512), "HostConfig.Ulimits[0].Soft"),
    "no nproc ulimit": (lambda b: b["HostConfig"]["Ulimits"].pop(), "HostConfig.Ulimits"),
    "unknown ulimit": (
        lambda b: b["HostConfig"]["Ulimits"].append({"Name": "memlock", "Soft": 1, "Hard": 1}),
        "HostConfig.Ulimits[6].Name",
    ),
    # fields the runtime never sends
    **{
        f"HostConfig.{field}": (_set(f"HostConfig.{field}", value), f"HostConfig.{field}")
        for field, value in (
            ("Init", True),
            ("InitPath", "/host/evil"),
            ("CgroupParent", "/"),
            ("Binds", ["/:/host"]),
            ("Devices", [{"PathOnHost": "/dev/kvm"}]),
            ("DeviceRequests", [{"Count": -1}]),
            ("Sysctls", {"a": "b"}),
            ("PidMode", "host"),
            ("UTSMode", "host"),
            ("UsernsMode", "host"),
            ("VolumesFrom", ["x"]),
            ("PortBindings", {"80/tcp": [{}]}),
            ("OomKillDisable", True),
            ("MemorySwappiness", 100),
            ("Isolation", "hyperv"),
            ("ExtraHosts", ["a:1.2.3.4"]),
            ("GroupAdd", ["0"]),
            ("BlkioWeight", 1000),
            ("Cgroup", "host"),
            ("Links", ["x:y"]),
            ("ConsoleSize", [1, 1]),
            ("privileged", True),
            ("hostConfig", {}),
            ("Runtime ", "runc"),
        )
    },  # fmt: skip
    "HostConfig.Runtime other": (_set("HostConfig.Runtime", "io.containerd.runc.v1"), "HostConfig.Runtime"),
    "HostConfig.Runtime kata": (_set("HostConfig.Runtime", "kata"), "HostConfig.Runtime"),
    "Privileged": (_set("HostConfig.Privileged", True), "HostConfig.Privileged"),
    "CapAdd": (_set("HostConfig.CapAdd", ["SYS_ADMIN"]), "HostConfig.CapAdd"),
    "CapDrop of one": (_set("HostConfig.CapDrop", ["NET_RAW"]), "HostConfig.CapDrop"),
    "writable root": (_set("HostConfig.ReadonlyRootfs", False), "HostConfig.ReadonlyRootfs"),
    "host IPC": (_set("HostConfig.IpcMode", "host"), "HostConfig.IpcMode"),
    "host cgroup namespace": (_set("HostConfig.CgroupnsMode", "host"), "HostConfig.CgroupnsMode"),
    "host network": (_set("HostConfig.NetworkMode", "host"), "HostConfig.NetworkMode"),
    "default bridge": (_set("HostConfig.NetworkMode", "bridge"), "HostConfig.NetworkMode"),
    "another container's network": (
        _set("HostConfig.NetworkMode", "container:execbox-redis-1"),
        "HostConfig.NetworkMode",
    ),
    "no NetworkMode (the default bridge)": (_drop("HostConfig.NetworkMode"), "HostConfig.NetworkMode"),
    "log driver sending elsewhere": (
        _set("HostConfig.LogConfig", {"Type": "syslog", "Config": {"syslog-address": "tcp://10.0.0.1:514"}}),
        "HostConfig.LogConfig",
    ),
    "DnsOptions": (_set("HostConfig.DnsOptions", ["ndots:15"]), "HostConfig.DnsOptions"),
    # top level
    "other image": (_set("Image", "execbox/service:latest"), "Image"),
    "image with a trailing newline": (_set("Image", "execbox/sandbox-python:latest\n"), "Image"),
    "another deployment's labels": (
        _set("Labels", {"execbox.managed": "true", "execbox.deployment": "other"}),
        "Labels",
    ),
    "Entrypoint": (_set("Entrypoint", ["/bin/sh"]), "Entrypoint"),
    "Volumes": (_set("Volumes", {"/data": {}}), "Volumes"),
    "Healthcheck": (_set("Healthcheck", {"Test": ["CMD", "true"]}), "Healthcheck"),
    "NetworkingConfig": (_set("NetworkingConfig", {"EndpointsConfig": {"host": {}}}), "NetworkingConfig"),
    "user spelled in lower case": (_set("user", "0:0"), "user"),
    "no HostConfig": (_drop("HostConfig"), "HostConfig"),
    "HostConfig not an object": (_set("HostConfig", []), "HostConfig"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_create_body_is_refused_naming_its_field(one_shot: dict[str, Any], shape: Shape, case: str) -> None:
    body = copy.deepcopy(one_shot)
    change, field = HOSTILE[case]
    change(body)
    with pytest.raises(rules.Refused) as refused:
        containers.check_create(body, DEPLOYMENT, _network_is_ours, shape)
    assert refused.value.field == field, refused.value.reason


def test_the_engines_defaults_pass_and_so_do_stricter_paths(one_shot: dict[str, Any], shape: Shape) -> None:
    body = one_shot
    for change in (_drop("HostConfig.MaskedPaths"), _set("HostConfig.ReadonlyPaths", None)):
        changed = copy.deepcopy(body)
        change(changed)
        containers.check_create(changed, DEPLOYMENT, _network_is_ours, shape)
    stricter = copy.deepcopy(body)
    stricter["HostConfig"]["ReadonlyPaths"] = [*containers.DOCKER_READONLY_PATHS, "/proc/self/attr"]
    containers.check_create(stricter, DEPLOYMENT, _network_is_ours, shape)


UPDATES: dict[str, tuple[Any, str]] = {
    "Memory 64 GiB": ({"Memory": 64 * GIB, "MemorySwap": 64 * GIB}, "Memory"),
    "swap without memory": ({"MemorySwap": -1}, "Memory"),
    "unlimited swap": ({"Memory": 256 << 20, "MemorySwap": -1}, "MemorySwap"),
    "CPU quota of 64 CPUs": ({"CpuPeriod": 100_000, "CpuQuota": 6_400_000}, "CpuQuota"),
    "CPU quota removed": ({"CpuPeriod": 100_000, "CpuQuota": -1}, "CpuQuota"),
    "a short period alone": ({"CpuPeriod": 1000}, "CpuPeriod"),
    "CPU weight above the default": ({"CpuShares": 4096}, "CpuShares"),
    "pids unlimited": ({"PidsLimit": -1}, "PidsLimit"),
    "restart policy": ({"RestartPolicy": {"Name": "always"}}, "RestartPolicy"),
    "not an object": ([], "body"),
}


@pytest.mark.parametrize("case", list(UPDATES))
def test_a_hostile_update_is_refused_naming_its_field(shape: Shape, case: str) -> None:
    body, field = UPDATES[case]
    with pytest.raises(rules.Refused) as refused:
        containers.check_update(body, shape)
    assert refused.value.field == field, refused.value.reason


LISTINGS: dict[str, tuple[str, str]] = {
    "label named in another parameter": ("all=1&execbox.managed=1", "filters"),
    "no filter": ("all=1", "filters"),
    "managed label alone": ('all=1&filters={"label": ["execbox.managed=true"]}', "filters.label"),
    "another deployment": (
        'filters={"label": ["execbox.managed=true", "execbox.deployment=other"]}',
        "filters.label",
    ),
    "label in a name filter": ('filters={"name": ["execbox.managed=true"]}', "filters"),
    "filter as a substring": (
        'filters={"label": ["x-execbox.managed=true-x", "execbox.deployment=execbox"]}',
        "filters.label",
    ),
    "filters twice": (
        'filters={"label": ["execbox.managed=true", "execbox.deployment=execbox"]}&filters={}',
        "filters",
    ),
    "a third, widening entry": (
        'filters={"label": ["execbox.managed=true", "execbox.deployment=execbox", "other"]}',
        "filters.label",
    ),
    "the map form": ('filters={"label": {"execbox.managed=true": true}}', "filters.label"),
    "semicolon separator": (
        'all=1;filters={"label": ["execbox.managed=true", "execbox.deployment=execbox"]}',
        "query",
    ),
    "filters not JSON": ("filters=execbox.managed", "filters"),
}


@pytest.mark.parametrize("case", list(LISTINGS))
def test_a_listing_without_exactly_this_deployments_filter_is_refused(case: str) -> None:
    query, field = LISTINGS[case]
    encoded = requests.Request("GET", "http://docker/containers/json?" + query).prepare().url or ""
    with pytest.raises(rules.Refused) as refused:
        rules.check_listing(urlsplit(encoded).query, DEPLOYMENT)
    assert refused.value.field == field, refused.value.reason


@pytest.mark.parametrize(
    "name", ["execbox/service:latest", "redis:7", "sha256:0123abcd", "execbox%2Fsandbox-python%0A", "../x"]
)
def test_only_sandbox_images_are_inspected(name: str) -> None:
    route = rules.route("GET", f"/v1.44/images/{name}/json")
    assert route.scope == "image"
    with pytest.raises(rules.Refused) as refused:
        rules.check_image(route.object_id or "")
    assert refused.value.field == "image"


def test_a_key_given_twice_is_refused() -> None:
    """The engine's decoder merges a second HostConfig into the first: what the proxy checked
    (Python keeps the last) would not be what runs."""
    with pytest.raises(rules.Refused) as refused:
        rules.decode(b'{"HostConfig": {"Privileged": true}, "HostConfig": {"Memory": 1}}')
    assert refused.value.field == "HostConfig"
    with pytest.raises(rules.Refused) as refused:
        rules.decode(b'{"Memory": NaN}')
    assert refused.value.field == "body"


def test_the_shape_takes_the_highest_ceilings_and_the_workers_settings(tmp_path: Path) -> None:
    policies = _policies(tmp_path / "policies")
    (policies / "huge.yaml").write_text("ceilings: {memory_mb: 16384, cpu: 3.5}\n")
    shape = shape_from(DockerSettings(uid_range="300000-300999", oom_score_adj=500), policies, SUBNET_POOL)
    assert (shape.memory_mb, shape.cpu, shape.pids, shape.disk_mb) == (16384, 3.5, 256, 2048)
    assert (shape.uids, shape.oom_score_adj) == (range(300000, 301000), 500)
    assert len(shape.seccomp_digests) == 4  # two narrowings (none, narrow.yaml's), each for runc and gVisor
    assert json.loads((ROOT / "policies" / "seccomp.json").read_text())["defaultAction"] != "SCMP_ACT_ALLOW"


# -- networks ----------------------------------------------------------------------------------------


class Lease:
    """Every /28 is free (the runtime asks the run's lease in Redis)."""

    def reserve(self, subnet: str) -> bool:
        return True

    def release(self, subnet: str) -> None:
        pass

    def register(self, proxy_address: str) -> None:
        pass


def _network_calls(runtime: RecordedRuntime) -> list[tuple[str, Any]]:
    """(scope, body) of each call the runtime makes to open and close a run's egress network."""
    networks = EgressNetworks(lambda: runtime.api)
    network = networks.open("exe_1", DEPLOYMENT, EgressSpec("execbox-egress", 3128, SUBNET_POOL, Lease()))
    networks.close(network)
    return [(rules.route(method, path).scope, body) for method, path, _, body in runtime.recorder.calls()]


def test_the_runtimes_network_calls_are_accepted(runtime: RecordedRuntime, shape: Shape) -> None:
    calls = _network_calls(runtime)
    assert [scope for scope, _ in calls] == ["network-create", "network-connect", "network-connect", "network"]
    for scope, body in calls:
        if scope == "network-create":
            networks.check_network_create(body, DEPLOYMENT, shape.subnet_pool)
        elif scope == "network-connect":
            networks.check_connect(body, "execbox-egress", shape.subnet_pool)


NETWORKS: dict[str, tuple[Callable[[Body], None], str]] = {
    "not internal": (_set("Internal", False), "Internal"),
    "macvlan on the host's interface": (_set("Driver", "macvlan"), "Driver"),
    "the host's bridge": (
        _set(
            "Options", {"com.docker.network.bridge.inhibit_ipv4": "true", "com.docker.network.bridge.name": "docker0"}
        ),
        "Options",
    ),
    "an address for the host": (_set("Options", {}), "Options"),
    "a subnet outside the pool": (
        lambda b: b["IPAM"]["Config"][0].update(Subnet="172.17.0.0/28"),
        "IPAM.Config[0].Subnet",
    ),
    "the whole pool": (lambda b: b["IPAM"]["Config"][0].update(Subnet="10.0.0.0/8"), "IPAM.Config[0].Subnet"),
    "a gateway elsewhere": (lambda b: b["IPAM"]["Config"][0].update(Gateway="172.17.0.1"), "IPAM.Config[0].Gateway"),
    "a second subnet": (lambda b: b["IPAM"]["Config"].append({"Subnet": "172.17.0.0/16"}), "IPAM.Config"),
    "another IPAM driver": (lambda b: b["IPAM"].update(Driver="dhcp"), "IPAM.Driver"),
    "another deployment's labels": (_set("Labels", {"execbox.managed": "true", "execbox.deployment": "x"}), "Labels"),
    "attachable by any container": (_set("Attachable", True), "Attachable"),
    "a config from another network": (_set("ConfigFrom", {"Network": "bridge"}), "ConfigFrom"),
    "IPv6": (_set("EnableIPv6", True), "EnableIPv6"),
}


@pytest.mark.parametrize("case", list(NETWORKS))
def test_a_hostile_network_is_refused_naming_its_field(runtime: RecordedRuntime, shape: Shape, case: str) -> None:
    [body] = [body for scope, body in _network_calls(runtime) if scope == "network-create"]
    change, field = NETWORKS[case]
    change(body)
    with pytest.raises(rules.Refused) as refused:
        networks.check_network_create(body, DEPLOYMENT, shape.subnet_pool)
    assert refused.value.field == field, refused.value.reason


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"Container": "execbox-redis-1"}, "Container"),
        ({"Container": "execbox-egress", "EndpointConfig": {"Aliases": ["redis"]}}, "EndpointConfig.Aliases"),
        ({"Container": "execbox-egress", "EndpointConfig": {"IPAMConfig": {"IPv4Address": "172.17.0.9"}}},
         "EndpointConfig.IPAMConfig.IPv4Address"),
        ({"Container": "execbox-egress", "EndpointConfig": {"IPAMConfig": {"IPv4Address": 180223234}}},
         "EndpointConfig.IPAMConfig.IPv4Address"),
    ],
)  # fmt: skip
def test_only_the_egress_proxy_is_connected_at_an_address_of_the_pool(
    shape: Shape, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(rules.Refused) as refused:
        networks.check_connect(body, "execbox-egress", shape.subnet_pool)
    assert refused.value.field == field, refused.value.reason
