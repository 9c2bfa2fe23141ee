"""docker-proxy on a Swarm node (issue 30): the egress proxy is a service's task whose container
name Swarm chooses; workers still name `execbox-egress`, and the proxy connects that node's task.

Against the real engine, with a plain container carrying the label a Swarm task carries (Swarm
itself is exercised by tests/cluster)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from docker.models.containers import Container

from execbox.dockerproxy.rules import DEPLOYMENT, MANAGED
from tests.conftest import EXECBOX, Processes, wait_until

pytestmark = [pytest.mark.docker]
DEPLOYMENT_NAME = f"exbsw{secrets.token_hex(3)}"
SERVICE = f"{DEPLOYMENT_NAME}_egress"
IMAGE = "local/debian:trixie"


@pytest.fixture
def proxied(processes: Processes, tmp_path: Path) -> Iterator[docker.APIClient]:
    path = tmp_path / "docker.sock"
    processes.spawn(f"docker-proxy-{DEPLOYMENT_NAME}", [EXECBOX, "docker-proxy", "--listen", str(path),
                    "--deployment", DEPLOYMENT_NAME, "--egress-container", "execbox-egress",
                    "--egress-service", SERVICE], dict(os.environ))  # fmt: skip
    wait_until(path.exists, 10, "the docker proxy's socket")
    client = docker.APIClient(base_url=f"unix://{path}", timeout=30)
    yield client
    client.close()


@pytest.fixture
def run_network(docker_client: docker.DockerClient) -> Iterator[str]:
    network = docker_client.networks.create(
        f"{DEPLOYMENT_NAME}-run-{secrets.token_hex(3)}", driver="bridge", internal=True,
        labels={MANAGED: "true", DEPLOYMENT: DEPLOYMENT_NAME},
    )  # fmt: skip
    yield str(network.id)
    network.remove()


@pytest.fixture
def egress_task(docker_client: docker.DockerClient) -> Iterator[Container]:
    """What Swarm runs for the egress service on this node: a container labelled with the service."""
    container = docker_client.containers.run(
        IMAGE, ["sleep", "300"], detach=True, name=f"{SERVICE}.1.{secrets.token_hex(6)}",
        labels={"com.docker.swarm.service.name": SERVICE},
    )  # fmt: skip
    yield container
    container.remove(force=True)


def networks_of(container: Container) -> set[str]:
    container.reload()
    return {n["NetworkID"] for n in container.attrs["NetworkSettings"]["Networks"].values()}


def test_the_worker_names_execbox_egress_and_the_nodes_egress_task_is_connected_and_disconnected(
    proxied: docker.APIClient, run_network: str, egress_task: Container
) -> None:
    proxied.connect_container_to_network("execbox-egress", run_network)
    assert run_network in networks_of(egress_task)
    proxied.disconnect_container_from_network("execbox-egress", run_network)
    assert run_network not in networks_of(egress_task)


def test_no_other_container_may_be_connected_even_the_egress_task_by_its_own_name(
    proxied: docker.APIClient, run_network: str, egress_task: Container
) -> None:
    for name in (str(egress_task.name), "some-other-container"):
        with pytest.raises(docker.errors.APIError) as refused:
            proxied.connect_container_to_network(name, run_network)
        assert refused.value.status_code == 403
    assert run_network not in networks_of(egress_task)


def test_without_a_running_egress_task_on_the_node_the_connect_is_refused_and_says_why(
    proxied: docker.APIClient, run_network: str, egress_task: Container
) -> None:
    egress_task.stop(timeout=1)
    with pytest.raises(docker.errors.APIError) as refused:
        proxied.connect_container_to_network("execbox-egress", run_network)
    assert refused.value.status_code == 403
    assert "no running task of the egress service" in str(refused.value)
