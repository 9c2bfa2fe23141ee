"""Per-run egress networks: an internal bridge of the run's own with the egress proxy attached.

The proxy's address on that network identifies the run (execbox.egress). Each network takes a /28
of the operator's subnet pool, reserved in Redis for the run and cooling down after it, so that an
address never changes hands quickly.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import docker
import requests
from docker.errors import APIError, DockerException, NotFound
from docker.types import IPAMConfig, IPAMPool

from execbox.sandbox.errors import RuntimeUnavailable
from execbox.sandbox.runtime import DEPLOYMENT_LABEL, EXECUTION_LABEL, MANAGED_LABEL, EgressSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EgressNetwork:
    id: str
    proxy: str
    """The proxy's address on this network."""
    proxy_container: str
    subnet: str = ""
    release: Callable[[str], None] | None = None
    """Starts the slot's cool-down once the network is removed (None: a reaper sweep's network)."""

    def proxy_env(self, port: int) -> tuple[tuple[str, str], ...]:
        url = f"http://{self.proxy}:{port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
        return tuple((name, url) for name in names) + (("NO_PROXY", ""), ("no_proxy", ""))


class EgressNetworks:
    def __init__(self, api: Callable[[], docker.APIClient]) -> None:
        self._api = api

    def open(self, execution_id: str, deployment: str, egress: EgressSpec) -> EgressNetwork:
        """An internal network of the run's own (no route out, no address for the host on it) with
        the egress proxy attached; the proxy's address there identifies the run. Its /28 is reserved
        for the run in Redis and cools down after it, so an address never changes hands quickly."""
        pool = ipaddress.ip_network(egress.subnet_pool)
        slots = 2 ** (28 - pool.prefixlen)
        deadline = time.monotonic() + egress.slot_wait_s
        while True:
            # Small pools are tried in full, in random order; large ones by a few random draws.
            order = secrets.SystemRandom().sample(range(slots), min(slots, 16))
            for index in order:
                subnet = ipaddress.ip_network((int(pool.network_address) + index * 16, 28))
                if not egress.lease.reserve(str(subnet)):
                    continue
                network = self._create(execution_id, deployment, egress, subnet)
                if network is not None:
                    return network
                egress.lease.release(str(subnet))  # another deployment on this engine holds it
            if time.monotonic() >= deadline:
                raise RuntimeUnavailable(
                    f"no free /28 in the egress subnet pool {pool}: every slot tried is in use or cooling down "
                    "after a run (EXECBOX_EGRESS__SLOT_COOLDOWN_S); retry, or give the pool more room"
                )
            time.sleep(0.2)  # slots free up by expiry in Redis, which sends no notification here

    def _create(
        self,
        execution_id: str,
        deployment: str,
        egress: EgressSpec,
        subnet: ipaddress.IPv4Network | ipaddress.IPv6Network,
    ) -> EgressNetwork | None:
        api = self._api()
        labels = {MANAGED_LABEL: "true", DEPLOYMENT_LABEL: deployment, EXECUTION_LABEL: execution_id}
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet), gateway=str(subnet[1]))])
        try:
            created = api.create_network(
                f"execbox-{execution_id}-{subnet.network_address}", driver="bridge", internal=True, ipam=ipam,
                labels=labels, options={"com.docker.network.bridge.inhibit_ipv4": "true"},
            )  # fmt: skip
        except APIError as exc:
            if "overlap" in str(exc).lower():
                return None
            raise
        network = EgressNetwork(
            str(created["Id"]), str(subnet[2]), egress.proxy_container, str(subnet), egress.lease.release
        )
        try:
            api.connect_container_to_network(egress.proxy_container, network.id, ipv4_address=network.proxy)
            egress.lease.register(network.proxy)
        except NotFound as exc:
            self.close(network)
            raise RuntimeUnavailable(
                f"the egress proxy container {egress.proxy_container!r} is not running on this worker's engine "
                "(EXECBOX_EGRESS__CONTAINER; `make up` starts it)"
            ) from exc
        except BaseException:
            self.close(network)
            raise
        return network

    def close(self, network: EgressNetwork) -> None:
        try:
            self._api().disconnect_container_from_network(network.proxy_container, network.id, force=True)
        except (DockerException, requests.RequestException):
            pass  # not connected (any more)
        try:
            self._api().remove_network(network.id)
        except NotFound:
            pass
        except (DockerException, requests.RequestException) as exc:
            log.warning("could not remove network %s: %s", network.id[:12], exc)  # the reaper retries
            return  # the slot stays reserved until its reservation lapses
        if network.release is not None:
            try:
                network.release(network.subnet)
            except Exception as exc:  # the reservation lapses on its own
                log.warning("could not start the cool-down of slot %s: %s", network.subnet, exc)
