"""deploy/kubernetes checked without a cluster: every kustomization rendered by a real kustomize
(Debian's `kustomize`, or `kubectl kustomize`; scripts/install installs the first) and by this
file's own reader of the raw files, every object validated against the Kubernetes schema
(strict), every workload hardened, and what each overlay promises: S3 instead of the shared
volume, SeaweedFS with two copies, Redis through three Sentinels, network policies that admit
exactly the new flows, the worker naming its node. The manifests are never applied here: no
Kubernetes can be installed on these machines (docs/decisions.md, issue 30 item 5)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import kubernetes_validate
import pytest
import yaml

from execbox.core import sentinel
from execbox.files.settings import ArtifactBackend
from execbox.settings import Settings

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(ROOT.glob("**/kustomization.yaml"))
CRD_GROUPS = ("keda.sh/",)  # custom resources: checked by shape below, not by the core schema
K8S_VERSION = "1.30.0"
Obj = dict[str, Any]


def kind_of(kustomization: Path) -> str:
    return str(yaml.safe_load(kustomization.read_text()).get("kind", "Kustomization"))


BUILDS = [k for k in KUSTOMIZATIONS if kind_of(k) == "Kustomization"]  # components are built within these
COMPONENTS = [k for k in KUSTOMIZATIONS if kind_of(k) == "Component"]


def label(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


# --- the raw files, read by this file's own resolver (resources and components, no patches applied)


def objects(kustomization: Path) -> list[Obj]:
    """Every object a kustomization's files hold, following `resources` and `components`."""
    spec = yaml.safe_load(kustomization.read_text())
    found: list[Obj] = []
    for entry in [*spec.get("resources", []), *spec.get("components", [])]:
        target = (kustomization.parent / entry).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), f"{kustomization}: {entry} has no kustomization.yaml"
            found += objects(target / "kustomization.yaml")
        else:
            assert target.is_file(), f"{kustomization}: missing resource {entry}"
            found += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]
    return found


def patch_targets(kustomization: Path) -> list[tuple[str, str]]:
    """(kind, name) of every patch of a kustomization and of its components: named by `target`, or
    by the patch file's own kind and name."""
    spec = yaml.safe_load(kustomization.read_text())
    found = []
    for patch in spec.get("patches", []):
        if "target" in patch:
            found.append((patch["target"]["kind"], patch["target"]["name"]))
        else:
            for doc in yaml.safe_load_all((kustomization.parent / patch["path"]).read_text()):
                found.append((doc["kind"], doc["metadata"]["name"]))
    for entry in spec.get("components", []):
        found += patch_targets((kustomization.parent / entry).resolve() / "kustomization.yaml")
    return found


@pytest.mark.parametrize("kustomization", BUILDS, ids=label)
def test_kustomization_resolves_and_patches_hit_objects(kustomization: Path) -> None:
    present = {(o["kind"], o["metadata"]["name"]) for o in objects(kustomization)}
    for target in patch_targets(kustomization):
        assert target in present, f"{kustomization}: a patch targets nothing: {target}"


def test_every_component_is_used_by_an_overlay() -> None:
    used = set()
    for build in BUILDS:
        for entry in yaml.safe_load(build.read_text()).get("components", []):
            used.add((build.parent / entry).resolve() / "kustomization.yaml")
    assert set(COMPONENTS) <= used, set(COMPONENTS) - used


def all_raw_objects() -> list[Obj]:
    unique: dict[tuple[str, str], Obj] = {}
    for kustomization in KUSTOMIZATIONS:
        for obj in objects(kustomization):
            unique[(obj["kind"], obj["metadata"]["name"])] = obj
    return list(unique.values())


@pytest.mark.parametrize("obj", all_raw_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_object_in_the_files_is_valid_and_hardened(obj: Obj) -> None:
    check_object(obj, f"{obj['kind']}/{obj['metadata']['name']}")


# --- the same checks on what a real kustomize renders (patches, components, generators applied)


def kustomize_command() -> list[str]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    pytest.fail("neither kustomize nor kubectl is on PATH: run scripts/install (it installs Debian's kustomize)")


@functools.cache
def rendered(build: str) -> list[Obj]:
    """What `kustomize build deploy/kubernetes/<build>` renders."""
    done = subprocess.run(
        [*kustomize_command(), str(ROOT / build)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kustomize build {build} failed: {done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("build", [label(b) for b in BUILDS])
def test_rendered_objects_are_valid_and_hardened(build: str) -> None:
    objs = rendered(build)
    assert objs, f"{build} renders nothing"
    names = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names)), f"{build}: an object twice"
    for obj in objs:
        check_object(obj, f"{build}: {obj['kind']}/{obj['metadata']['name']}")
        assert obj["kind"] == "Namespace" or obj["metadata"].get("namespace") == "execbox", obj["metadata"]


def check_object(obj: Obj, where: str) -> None:
    if obj["apiVersion"].startswith(CRD_GROUPS):
        assert obj["metadata"]["name"] and isinstance(obj["spec"], dict)
        if obj["kind"] == "ScaledObject":
            assert obj["spec"]["scaleTargetRef"]["name"] and obj["spec"]["triggers"]
        return
    validate(json.dumps(obj, sort_keys=True))
    pod = pod_spec(obj)
    if pod is not None:
        check_pod(pod, where)


@functools.cache
def validate(document: str) -> None:
    """Strict schema validation, once per distinct object (most of the base is in every build)."""
    kubernetes_validate.validate(json.loads(document), K8S_VERSION, strict=True)


def pod_spec(obj: Obj) -> Obj | None:
    return cast(Obj | None, obj.get("spec", {}).get("template", {}).get("spec"))


def check_pod(pod: Obj, where: str) -> None:
    """As the base: requests and limits, a probe, no privilege, read-only root, every capability
    dropped, the runtime's default seccomp profile, and a non-root user (the docker-proxy alone
    runs as root, for the node's root:docker 0660 socket)."""
    pod_security = pod.get("securityContext", {})
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = f"{where} container {container['name']}"
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{name}: cpu and memory {bound}"
        assert container.get("livenessProbe") or container.get("readinessProbe"), f"{name}: probes"
        security = container.get("securityContext", {})
        assert security.get("allowPrivilegeEscalation") is False, name
        assert security.get("capabilities") == {"drop": ["ALL"]}, name
        assert security.get("readOnlyRootFilesystem") is True, name
        assert not security.get("privileged"), name
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile", {}))
        assert seccomp.get("type") == "RuntimeDefault", f"{name}: seccomp RuntimeDefault"
        non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        user = security.get("runAsUser", pod_security.get("runAsUser"))
        if container["name"] == "docker-proxy":
            assert user == 0 and not non_root, name
        else:
            assert non_root is True and user != 0, f"{name}: runAsNonRoot"


# --- what each overlay promises, on the rendered objects


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if pod_spec(o) is not None]


def container(obj: Obj, name: str) -> Obj:
    pod = pod_spec(obj)
    assert pod is not None
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return cast(Obj, found)


def environment(objs: list[Obj], obj: Obj, name: str) -> dict[str, str]:
    """The environment a container starts with, as the kubelet builds it: ConfigMaps of the render,
    `$(VAR)` references expanded, a Secret's key as the placeholder `<secret>.<key>`, the node's
    name as `node-a`, the pod's as the workload's first."""
    spec = container(obj, name)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(find(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in spec.get("env", []):
        if "value" in entry:
            value = entry["value"]
            for known, known_value in env.items():
                value = value.replace(f"$({known})", known_value)
            env[entry["name"]] = value
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = f"{ref['name']}.{ref['key']}"
        elif entry["valueFrom"].get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[entry["name"]] = "node-a"
        elif entry["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[entry["name"]] = f"{obj['metadata']['name']}-0"
        else:
            raise AssertionError(f"{name}: {entry['name']} comes from {entry['valueFrom']}, not known here")
    return env


def loaded(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """execbox's own Settings, loaded from exactly this environment: a misspelt name is not applied."""
    for name in list(os.environ):
        if name.startswith("EXECBOX_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


# The execbox processes of the S3 builds: (kind, name, container).
CLIENTS = [("Deployment", "execbox-api", "api"), ("DaemonSet", "execbox-worker", "worker")]
S3_BUILDS = ["overlays/s3", "overlays/seaweedfs", "overlays/many-hosts"]
SENTINEL_BUILDS = ["overlays/sentinel", "overlays/many-hosts"]


@pytest.mark.parametrize("build", S3_BUILDS)
def test_s3_overlays_give_api_and_workers_the_bucket_and_no_shared_volume(
    build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = rendered(build)
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"], "the artifacts PVC is gone"
    for obj in workloads(objs):
        pod = pod_spec(obj)
        assert pod is not None
        claims = [v for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]
        assert not claims, f"{obj['metadata']['name']} still mounts {claims}"
    for kind, name, process in CLIENTS:
        workload = find(objs, kind, name)
        env = environment(objs, workload, process)
        assert "EXECBOX_ARTIFACTS__SECRET_KEY" not in env, "the secret key goes in as a file, not in the environment"
        artifacts = loaded(monkeypatch, env).artifacts
        assert artifacts.store is ArtifactBackend.S3 and artifacts.endpoint and artifacts.bucket
        assert artifacts.access_key == "execbox-s3.access-key"
        # The secret key file is the Secret execbox-s3's secret-key, mounted where the setting says.
        key_file = artifacts.secret_key_file
        assert key_file is not None
        mounts = {m["name"]: m["mountPath"] for m in container(workload, process)["volumeMounts"]}
        pod = pod_spec(workload)
        assert pod is not None
        volumes = [
            v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "execbox-s3" and v["name"] in mounts
        ]
        assert len(volumes) == 1, f"{name}: the Secret execbox-s3 mounted once"
        items = {i["key"]: i["path"] for i in volumes[0]["secret"]["items"]}
        assert Path(mounts[volumes[0]["name"]]) / items["secret-key"] == key_file


def test_the_seaweedfs_overlay_points_the_store_at_its_gateway_and_the_external_one_at_no_cluster_host() -> None:
    external = find(rendered("overlays/s3"), "ConfigMap", "execbox-artifacts-s3")["data"]
    assert external["EXECBOX_ARTIFACTS__ENDPOINT"].startswith("https://")
    for build in ("overlays/seaweedfs", "overlays/many-hosts"):
        objs = rendered(build)
        endpoint = find(objs, "ConfigMap", "execbox-artifacts-s3")["data"]["EXECBOX_ARTIFACTS__ENDPOINT"]
        host, port = endpoint.removeprefix("http://").split(":")
        service = find(objs, "Service", host)
        assert int(port) in [p["port"] for p in service["spec"]["ports"]]
        gateway = find(objs, "Deployment", "execbox-seaweedfs-s3")
        assert service["spec"]["selector"].items() <= gateway["spec"]["template"]["metadata"]["labels"].items()
        assert "weed" in container(gateway, "s3")["command"][0]


def flag(command: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"-{name}=")]
    return value


def stable_name_of(objs: list[Obj], address: str) -> Obj:
    """The StatefulSet whose pod a `<set>-<ordinal>.<headless service>[:port]` address names, after
    checking that the ordinal exists and the Service is headless, published before readiness and
    selects that set's pods."""
    host = address.split(":")[0]
    pod, service_name = host.split(".")
    service = find(objs, "Service", service_name)
    assert service["spec"].get("clusterIP") == "None" and service["spec"].get("publishNotReadyAddresses") is True
    set_name, ordinal = pod.rsplit("-", 1)
    stateful = find(objs, "StatefulSet", set_name)
    assert stateful["spec"]["serviceName"] == service_name
    assert int(ordinal) < stateful["spec"]["replicas"], address
    assert service["spec"]["selector"].items() <= stateful["spec"]["template"]["metadata"]["labels"].items()
    return stateful


@pytest.mark.parametrize("build", ["overlays/seaweedfs", "overlays/many-hosts"])
def test_seaweedfs_keeps_two_copies_on_two_volume_servers_on_two_nodes(build: str) -> None:
    objs = rendered(build)
    master = find(objs, "StatefulSet", "execbox-seaweedfs-master")
    volume = find(objs, "StatefulSet", "execbox-seaweedfs-volume")
    filer = find(objs, "StatefulSet", "execbox-seaweedfs-filer")
    gateway = find(objs, "Deployment", "execbox-seaweedfs-s3")
    master_cmd = container(master, "master")["command"]
    assert flag(master_cmd, "defaultReplication") == "001"
    assert flag(container(filer, "filer")["command"], "defaultReplicaPlacement") == "001"
    assert volume["spec"]["replicas"] >= 2
    (spread,) = volume["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    # Each server announces and finds the others by stable names, and keeps its state on a volume.
    for stateful, name in ((master, "master"), (volume, "volume"), (filer, "filer")):
        command = container(stateful, name)["command"]
        assert flag(command, "ip") == f"$(POD_NAME).{stateful['spec']['serviceName']}"
        assert stateful["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    for command in (container(volume, "volume")["command"], container(filer, "filer")["command"]):
        assert stable_name_of(objs, flag(command, "master")) is master
    assert stable_name_of(objs, flag(container(gateway, "s3")["command"], "filer")) is filer


@pytest.mark.parametrize("build", [label(b) for b in BUILDS])
def test_each_component_connects_as_its_own_redis_role(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No shared Redis password: each process connects as its role with its role's Secret, through
    the three Sentinels where the build has them, to the single Redis otherwise."""
    objs = rendered(build)
    has_sentinels = any(o["kind"] == "StatefulSet" and o["metadata"]["name"] == "execbox-sentinel" for o in objs)
    roles = set()
    for obj in workloads(objs):
        for process in obj["spec"]["template"]["spec"]["containers"]:
            env = environment(objs, obj, process["name"])
            if "EXECBOX_REDIS__URL" not in env:
                continue
            role = process["name"]
            roles.add(role)
            redis_settings = loaded(monkeypatch, env).redis
            secret = f"execbox-redis-{role}.password"
            if has_sentinels:
                target = sentinel.parse(redis_settings.url)
                assert (target.username, target.password) == (role, secret)
                sentinels = find(objs, "StatefulSet", "execbox-sentinel")
                assert target.sentinels == tuple(
                    (f"execbox-sentinel-{i}.execbox-sentinel", 26379) for i in range(sentinels["spec"]["replicas"])
                )
                assert all(stable_name_of(objs, host) is sentinels for host, _ in target.sentinels)
                assert target.master == "execbox" and f"master_name={target.master}" in script(objs, "sentinel.sh")
                assert redis_settings.accept_replicas == 1  # the acceptance waits for the replica (WAIT 1)
            else:
                assert redis_settings.url == f"redis://{role}:{secret}@execbox-redis:6379/0"
    assert roles == {"api", "worker"}, f"{build}: processes with a Redis URL: {roles}"
    if not has_sentinels:
        redis = find(objs, "StatefulSet", "execbox-redis")
        assert "--aclfile" in container(redis, "redis")["command"]


def script(objs: list[Obj], name: str) -> str:
    (scripts,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("execbox-redis-ha")]
    return str(scripts["data"][name])


@pytest.mark.parametrize("build", SENTINEL_BUILDS)
def test_sentinel_overlays_run_two_data_nodes_and_three_sentinels_by_stable_names(build: str) -> None:
    objs = rendered(build)
    assert not [o for o in objs if o["metadata"]["name"] == "execbox-redis"], "the single Redis is gone"
    nodes = find(objs, "StatefulSet", "execbox-redis-node")
    sentinels = find(objs, "StatefulSet", "execbox-sentinel")
    assert nodes["spec"]["replicas"] == 2 and sentinels["spec"]["replicas"] == 3
    node_script, sentinel_script = script(objs, "redis-node.sh"), script(objs, "sentinel.sh")
    # The scripts' own behaviour is tested in test_k8s_ha_scripts.py; here, that they name these objects.
    assert f"service={nodes['spec']['serviceName']}" in node_script
    assert f"service={sentinels['spec']['serviceName']}" in sentinel_script
    assert f"nodes={nodes['spec']['serviceName']}" in sentinel_script
    # The data nodes load the roles' users file from the Secret, at the path the script names.
    redis = container(nodes, "redis")
    mounts = {m["name"]: m["mountPath"] for m in redis["volumeMounts"]}
    acl = [v for v in nodes["spec"]["template"]["spec"]["volumes"] if v.get("secret", {}).get("secretName")]
    assert [v["secret"]["secretName"] for v in acl] == ["execbox-redis-acl"]
    assert f"aclfile {mounts[acl[0]['name']]}/users.acl" in node_script
    for stateful, process in ((nodes, "redis"), (sentinels, "sentinel")):
        spec = container(stateful, process)
        assert spec["command"][0] == "sh"
        scripts_mount = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}["scripts"]
        assert spec["command"][1].startswith(scripts_mount + "/")
        service = find(objs, "Service", stateful["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True


def test_many_hosts_workers_name_their_node_and_combine_sentinel_and_seaweedfs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = rendered("overlays/many-hosts")
    worker = find(objs, "DaemonSet", "execbox-worker")
    (node,) = [e for e in container(worker, "worker")["env"] if e["name"] == "EXECBOX_WORKER__NODE"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    names = {o["metadata"]["name"] for o in objs}
    assert {"execbox-sentinel", "execbox-redis-node", "execbox-seaweedfs-volume", "execbox-seaweedfs-s3"} <= names


# --- network policies: what the base denies, each overlay admits exactly its new flows


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is read here: {selector}"
    return dict(selector.get("matchLabels", {})).items() <= labels.items()


def admitted(objs: list[Obj], source: str, target: str, port: int) -> bool:
    """Whether a pod named `source` (app.kubernetes.io/name) in the namespace may open `port` on a
    pod named `target`: with ingress policies, allowed when one policy selecting the target allows it."""
    src, dst = {"app.kubernetes.io/name": source}, {"app.kubernetes.io/name": target}
    policies = [o for o in objs if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"], dst)]
    assert policies, f"no policy selects {target}"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            by_peer = peers is None or any("podSelector" in p and selects(p["podSelector"], src) for p in peers)
            ports = rule.get("ports")
            if by_peer and (ports is None or any(p["port"] == port for p in ports)):
                return True
    return False


SENTINEL_FLOWS = [
    *[(c, "execbox-sentinel", 26379) for c in ("execbox-api", "execbox-worker", "execbox-redis", "execbox-sentinel")],
    *[(c, "execbox-redis", 6379) for c in ("execbox-api", "execbox-worker", "execbox-sentinel", "execbox-redis")],
]
SEAWEEDFS_FLOWS = [
    ("execbox-api", "execbox-seaweedfs-s3", 8333),
    ("execbox-worker", "execbox-seaweedfs-s3", 8333),
    ("execbox-seaweedfs-s3", "execbox-seaweedfs-filer", 8888),
    ("execbox-seaweedfs-s3", "execbox-seaweedfs-filer", 18888),
    ("execbox-seaweedfs-filer", "execbox-seaweedfs-master", 9333),
    ("execbox-seaweedfs-filer", "execbox-seaweedfs-master", 19333),
    ("execbox-seaweedfs-volume", "execbox-seaweedfs-master", 19333),
    ("execbox-seaweedfs-master", "execbox-seaweedfs-volume", 18080),
    ("execbox-seaweedfs-filer", "execbox-seaweedfs-volume", 8080),
    ("execbox-seaweedfs-s3", "execbox-seaweedfs-volume", 8080),
    ("execbox-seaweedfs-volume", "execbox-seaweedfs-volume", 8080),
]
REFUSED = [
    ("execbox-api", "execbox-seaweedfs-master", 9333),
    ("execbox-worker", "execbox-seaweedfs-volume", 8080),
    ("execbox-worker", "execbox-seaweedfs-filer", 8888),
    ("execbox-seaweedfs-s3", "execbox-redis", 6379),
    ("execbox-seaweedfs-s3", "execbox-sentinel", 26379),
    ("execbox-api", "execbox-sentinel", 6379),
]


@pytest.mark.parametrize("build", [label(b) for b in BUILDS])
def test_network_policies_deny_by_default_and_admit_each_new_flow(build: str) -> None:
    objs = rendered(build)
    deny = find(objs, "NetworkPolicy", "default-deny-ingress")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    names = {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] for o in workloads(objs)}
    flows = [*(SENTINEL_FLOWS if "execbox-sentinel" in names else []),
             *(SEAWEEDFS_FLOWS if "execbox-seaweedfs-s3" in names else [])]  # fmt: skip
    for source, target, port in flows:
        assert admitted(objs, source, target, port), f"{build}: {source} -> {target}:{port} is refused"
    for source, target, port in REFUSED:
        if source in names and target in names:
            assert not admitted(objs, source, target, port), f"{build}: {source} -> {target}:{port} is admitted"


def test_keda_scales_the_worker_deployment_on_the_rq_queue() -> None:
    autoscale = rendered("overlays/autoscale")
    scaled = find(autoscale, "ScaledObject", "execbox-worker")
    target = scaled["spec"]["scaleTargetRef"]["name"]
    assert find(autoscale, "Deployment", target)
    assert not [o for o in autoscale if o["kind"] == "DaemonSet"]
    assert scaled["spec"]["triggers"][0]["metadata"]["listName"] == "rq:queue:execbox"
