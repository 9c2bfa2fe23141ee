"""Structural check of deploy/kubernetes: every kustomization resolves, every object validates
against the Kubernetes schema (strict), and every workload has requests, limits, probes and a
locked-down security context. (No cluster needed; kustomize itself is not required either.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(ROOT.glob("**/kustomization.yaml"))
CRD_GROUPS = ("keda.sh/",)  # custom resources: checked by shape below, not by the core schema
K8S_VERSION = "1.30.0"


def objects(kustomization: Path) -> list[dict[str, Any]]:
    """Every object a kustomization pulls in, following `resources` into bases."""
    spec = yaml.safe_load(kustomization.read_text())
    found: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        target = (kustomization.parent / entry).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), f"{kustomization}: {entry} has no kustomization.yaml"
            found += objects(target / "kustomization.yaml")
        else:
            assert target.is_file(), f"{kustomization}: missing resource {entry}"
            found += [doc for doc in yaml.safe_load_all(target.read_text()) if doc]
    return found


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_kustomization_resolves_and_patches_hit_objects(kustomization: Path) -> None:
    present = {(o["kind"], o["metadata"]["name"]) for o in objects(kustomization)}
    spec = yaml.safe_load(kustomization.read_text())
    for patch in spec.get("patches", []):
        target = patch["target"]
        assert (target["kind"], target["name"]) in present, f"{kustomization}: patch targets nothing: {target}"


def all_objects() -> list[dict[str, Any]]:
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for kustomization in KUSTOMIZATIONS:
        for obj in objects(kustomization):
            unique[(obj["kind"], obj["metadata"]["name"])] = obj
    return list(unique.values())


@pytest.mark.parametrize("obj", all_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_object_is_valid(obj: dict[str, Any]) -> None:
    if obj["apiVersion"].startswith(CRD_GROUPS):
        assert obj["metadata"]["name"] and isinstance(obj["spec"], dict)
        if obj["kind"] == "ScaledObject":
            assert obj["spec"]["scaleTargetRef"]["name"] and obj["spec"]["triggers"]
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    pod = obj.get("spec", {}).get("template", {}).get("spec")
    if pod is None:
        return
    for container in pod["containers"]:
        resources = container.get("resources", {})
        assert resources.get("requests") and resources.get("limits"), f"{container['name']}: requests and limits"
        assert container.get("livenessProbe") or container.get("readinessProbe"), f"{container['name']}: probes"
        security = container.get("securityContext", {})
        assert security.get("allowPrivilegeEscalation") is False and security.get("capabilities") == {"drop": ["ALL"]}
        assert not security.get("privileged")


def test_keda_scales_the_worker_deployment_on_the_rq_queue() -> None:
    autoscale = objects(ROOT / "overlays" / "autoscale" / "kustomization.yaml")
    scaled = next(o for o in autoscale if o["kind"] == "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]["name"]
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == target for o in autoscale)
    assert scaled["spec"]["triggers"][0]["metadata"]["listName"] == "rq:queue:execbox"


def test_each_component_uses_its_own_redis_role() -> None:
    """No manifest refers to a shared Redis password: the API and workers each read their role's
    Secret and connect as that user; Redis loads the users file."""
    for obj in all_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec") or {"containers": []}
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            url = env.get("EXECBOX_REDIS__URL", {}).get("value")
            if url is None:
                continue
            role = url.removeprefix("redis://").split(":")[0]
            assert role in {"api", "worker"}, url
            assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == f"execbox-redis-{role}"
    (redis,) = [o for o in all_objects() if o["kind"] == "StatefulSet"]
    assert "--aclfile" in redis["spec"]["template"]["spec"]["containers"][0]["command"]
