"""The one network shape a worker makes (execbox.sandbox.docker.networks), as an allow list: an
internal bridge of this deployment with a subnet from the egress pool and no address for the host,
and only the egress proxy connected to it, at an address of that pool."""

from __future__ import annotations

import ipaddress
from typing import Any

from execbox.dockerproxy.rules import Refused, booleans, fields, ours

INHIBIT_IPV4 = "com.docker.network.bridge.inhibit_ipv4"
Pool = ipaddress.IPv4Network | ipaddress.IPv6Network


def check_network_create(body: Any, deployment: str, pool: Pool) -> None:
    fields(body, "", {"Name", "Driver", "Options", "IPAM", "Labels", "Internal", "CheckDuplicate"},
           {"Name", "Driver", "Options", "IPAM", "Labels", "Internal"})  # fmt: skip
    if not isinstance(body["Name"], str):
        raise Refused("Name", "must be a string")
    if body["Driver"] != "bridge" or body["Internal"] is not True:
        raise Refused("Driver" if body["Driver"] != "bridge" else "Internal", "per-run networks are internal bridges")
    if not ours(body["Labels"], deployment) or not all(isinstance(v, str) for v in body["Labels"].values()):
        raise Refused("Labels", f"networks carry execbox.managed=true and execbox.deployment={deployment}")
    if body["Options"] != {INHIBIT_IPV4: "true"}:
        raise Refused("Options", f"only {INHIBIT_IPV4}=true: per-run networks give the host no address")
    booleans(body, "", ("CheckDuplicate",))
    ipam = body["IPAM"]
    fields(ipam, "IPAM", {"Driver", "Config", "Options"}, {"Config"})
    if ipam.get("Driver") not in (None, "default") or ipam.get("Options") not in (None, {}):
        raise Refused("IPAM.Driver", "the engine's default IPAM, without options")
    if not isinstance(ipam["Config"], list) or len(ipam["Config"]) != 1:
        raise Refused("IPAM.Config", "one subnet from the egress pool")
    config = ipam["Config"][0]
    fields(config, "IPAM.Config[0]", {"Subnet", "Gateway", "IPRange", "AuxiliaryAddresses"}, {"Subnet"})
    if config.get("IPRange") is not None or config.get("AuxiliaryAddresses") not in (None, {}):
        raise Refused("IPAM.Config[0].IPRange", "no range or auxiliary addresses")
    subnet = _network(config["Subnet"], "IPAM.Config[0].Subnet")
    if subnet.version != pool.version or not subnet.subnet_of(pool):  # type: ignore[arg-type]
        raise Refused("IPAM.Config[0].Subnet", f"{subnet} is not inside the egress subnet pool {pool}")
    if config.get("Gateway") is not None and _address(config["Gateway"], "IPAM.Config[0].Gateway") not in subnet:
        raise Refused("IPAM.Config[0].Gateway", f"must be an address of {subnet}")


def check_connect(body: Any, egress_container: str, pool: Pool) -> None:
    """Connect and disconnect: the egress proxy only, at an address of the pool."""
    fields(body, "", {"Container", "EndpointConfig", "Force"}, {"Container"})
    if body["Container"] != egress_container:
        raise Refused("Container", "only the egress proxy may be connected to or disconnected from a run's network")
    booleans(body, "", ("Force",))
    endpoint = body.get("EndpointConfig")
    if endpoint is None:
        return
    fields(endpoint, "EndpointConfig", {"IPAMConfig"}, set())
    if "IPAMConfig" not in endpoint:
        return  # the engine picks an address of the (owned) network's subnet
    fields(endpoint["IPAMConfig"], "EndpointConfig.IPAMConfig", {"IPv4Address"}, {"IPv4Address"})
    if _address(endpoint["IPAMConfig"]["IPv4Address"], "EndpointConfig.IPAMConfig.IPv4Address") not in pool:
        raise Refused("EndpointConfig.IPAMConfig.IPv4Address", f"must be an address of the egress pool {pool}")


def _network(value: Any, field: str) -> Pool:
    if not isinstance(value, str):
        raise Refused(field, "must be a string")
    try:
        return ipaddress.ip_network(value, strict=True)
    except (TypeError, ValueError) as exc:
        raise Refused(field, f"{value!r} is not a subnet") from exc


def _address(value: Any, field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if not isinstance(value, str):
        raise Refused(field, "must be a string")
    try:
        return ipaddress.ip_address(value)
    except (TypeError, ValueError) as exc:
        raise Refused(field, f"{value!r} is not an address") from exc


__all__ = ["INHIBIT_IPV4", "check_connect", "check_network_create"]
