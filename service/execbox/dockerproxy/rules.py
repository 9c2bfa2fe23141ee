"""What a worker may ask of the Docker engine (pure logic: paths, listings, bodies, ownership by label).

A worker that is taken over holds this socket instead of the engine's, so it can still start
sandboxes, but only of the one shape the runtime makes (execbox.dockerproxy.containers), only from
sandbox images, and only on containers and networks labelled as this deployment's; listings only
with exactly this deployment's label filter. Everything else is refused (403, naming the field)
before it reaches the engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

_VERSION = r"(?:/v1\.\d+)?"
_ID = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})"
# (method, path) -> scope: "engine" (no object), "listing" (its label filter is checked), "image" (a
# sandbox image), "container" or "network" (the captured id must be this deployment's), or a body
# check name.
ROUTES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (method, re.compile(f"^{_VERSION}{path}$"), scope)
    for method, path, scope in (
        ("GET", "/_ping", "engine"),
        ("HEAD", "/_ping", "engine"),
        ("GET", "/version", "engine"),
        ("GET", "/info", "engine"),
        ("GET", r"/images/([^?]+)/json", "image"),
        ("GET", "/containers/json", "listing"),
        ("GET", "/networks", "listing"),
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
SANDBOX_IMAGES = re.compile(r"execbox/sandbox-[a-z0-9-]+(?::[A-Za-z0-9._-]+)?")
"""Matched whole (fullmatch): `$` would also match before a trailing newline."""


class Refused(Exception):
    """A call the proxy does not pass on (403); `field` names the part of the request refused."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = f"{field}: {reason}"
        super().__init__(self.reason)


@dataclass(frozen=True)
class Route:
    scope: str
    object_id: str | None


def route(method: str, target: str) -> Route:
    path = target.split("?", 1)[0]
    for allowed_method, pattern, scope in ROUTES:
        found = pattern.match(path)
        if found and method == allowed_method:
            return Route(scope, found.group(1) if pattern.groups else None)
    raise Refused("path", f"{method} {path} is not a call execbox's workers make")


def ours(labels: Any, deployment: str) -> bool:
    if not isinstance(labels, dict):
        return False
    return labels.get(MANAGED) == "true" and labels.get(DEPLOYMENT) == deployment


def decode(body: bytes) -> Any:
    """A checked body, parsed strictly: a key twice in one object is refused (the engine's decoder
    merges or keeps the last, so what was checked need not be what it reads), and so are NaN and
    Infinity (no JSON) and nesting deeper than the parser's stack."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in items:
            if key in found:
                raise Refused(key, "appears twice in one object; send each field once")
            found[key] = value
        return found

    def constant(name: str) -> Any:
        raise Refused("body", f"{name} is not JSON")

    try:
        return json.loads(body or b"{}", object_pairs_hook=pairs, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        raise Refused("body", "is not JSON (or nests deeper than any worker's)") from exc


def check_listing(query: str, deployment: str) -> None:
    """A listing (containers, networks) must filter on exactly this deployment's two labels: the
    `filters` parameter once, as JSON, `{"label": ["execbox.managed=true", "execbox.deployment=<it>"]}`."""
    if ";" in query:
        raise Refused("query", "';' is not a separator workers use; send parameters joined by '&'")
    params = parse_qs(query, keep_blank_values=True)
    given = params.get("filters", [])
    if len(given) != 1:
        raise Refused("filters", f"a listing must give `filters` once (given {len(given)} times) with this "
                      "deployment's label filter")  # fmt: skip
    try:
        filters = decode(given[0].encode())
    except Refused as exc:
        raise Refused("filters", f"is not JSON ({exc.reason})") from exc
    if not isinstance(filters, dict) or set(filters) != {"label"}:
        raise Refused("filters", 'must be exactly {"label": [...]}: no other filter, and no filter is no listing')
    labels = filters["label"]
    wanted = {f"{DEPLOYMENT}={deployment}"}
    managed = [f"{MANAGED}=true", f"{MANAGED}=1"]
    if (
        not isinstance(labels, list)
        or len(labels) != 2
        or not all(isinstance(label, str) for label in labels)
        or wanted - set(labels)
        or not set(labels) - wanted <= set(managed)
        or not set(labels) & set(managed)
    ):
        raise Refused("filters.label", f"must be exactly [{managed[0]!r}, {next(iter(wanted))!r}]")


def check_image(name: str) -> None:
    image = unquote(name)
    if not SANDBOX_IMAGES.fullmatch(image):
        raise Refused("image", f"{image!r} is not a sandbox image (execbox/sandbox-<name>[:<tag>])")


def fields(value: Any, where: str, allowed: set[str], required: set[str]) -> None:
    """An object with only `allowed` keys, spelled exactly (the engine matches names case-insensitively,
    so another spelling would be read but not checked), and every `required` one."""
    if not isinstance(value, dict):
        raise Refused(where or "body", "must be a JSON object")
    prefix = f"{where}." if where else ""
    for key in value:
        if key not in allowed:
            raise Refused(f"{prefix}{key}", "is not a field execbox's workers send; leave it out")
    for key in sorted(required - set(value)):
        raise Refused(f"{prefix}{key}", "is required: every worker's call gives it")


def booleans(value: dict[str, Any], where: str, names: tuple[str, ...]) -> None:
    """Each of `names` that the object gives is true or false."""
    prefix = f"{where}." if where else ""
    for name in names:
        if name in value and not isinstance(value[name], bool):
            raise Refused(f"{prefix}{name}", "must be true or false")


__all__ = ["ROUTES", "SANDBOX_IMAGES", "Refused", "Route", "booleans", "check_image", "check_listing", "decode",
           "fields", "ours", "route"]  # fmt: skip
