"""/v1/admin: API keys (issue, list, revoke), shared scripts (publish, promote) and the nodes workers
run on (list, drain, undrain), with the operator's admin token."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path
from pydantic import BaseModel, Field

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import FleetDep, KeysDep, LibraryDep, PoliciesDep, SettingsDep, StoreDep
from execbox.api.problems import PROBLEM_DOC
from execbox.fleet.nodes import NODE_PATTERN, Nodes
from execbox.fleet.registry import WorkerRegistry
from execbox.fleet.schemas import NodePublic
from execbox.library.schemas import NAME_PATTERN, VERSION_PATTERN, Promote, ScriptCreate, ScriptVersion
from execbox.library.service import SHARED
from execbox.tenancy.apikeys import TENANT_PATTERN, TenantName, bearer_token
from execbox.tenancy.errors import AdminOff, InvalidKey, KeyNotFound, NotAdmin

_PROBLEM = PROBLEM_DOC
_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "The body is not JSON.", **_PROBLEM},
    401: {"description": "Missing or wrong admin token.", **_PROBLEM},
    403: {"description": "A tenant's API key, not the admin token.", **_PROBLEM},
    404: {"description": "Admin endpoints are off (no admin token configured) or no such key.", **_PROBLEM},
    422: {"description": "Invalid input.", **_PROBLEM},
}


class KeyCreate(BaseModel):
    tenant: TenantName = Field(pattern=TENANT_PATTERN.pattern, description="Tenant the key acts for.")
    require_approval: bool = Field(
        False,
        description="Every execution or run step with side effects (a write, or network access) this key submits "
        "waits for an approval, whether or not it asks for one, and the key may decide no approval.",
    )


class KeyPublic(BaseModel):
    key_id: str = Field(description="Names the key in listings and revocations.")
    tenant: str = Field(description="Tenant the key acts for.")
    created_at: float = Field(description="Unix time of issue.")
    revoked: bool = Field(description="Revoked keys are refused.")
    require_approval: bool = Field(False, description="Its writes wait for another key's approval.")
    key: str | None = Field(None, description="The key itself: returned once, at creation, never again.")


AdminHeader = Annotated[str | None, Header(alias="Authorization", description="`Bearer <admin token>`")]


def _admin(settings: SettingsDep, keys: KeysDep, authorization: AdminHeader = None) -> None:
    """Every admin route's first check, before its body is read (a router dependency)."""
    token = settings.auth.admin_token
    if token is None:
        raise AdminOff()
    given = bearer_token(authorization) or ""
    if secrets.compare_digest(given, token.get_secret_value()):
        return
    try:
        keys.tenant_of(authorization)
    except InvalidKey:
        raise InvalidKey("no admin token, or a wrong one") from None
    raise NotAdmin()  # a valid key of a tenant: who it is is known, what it asks is not its to do


router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=OffLoopRoute, dependencies=[Depends(_admin)])


@router.post("/keys", status_code=201, response_model=KeyPublic, responses=_RESPONSES, summary="Issue an API key")
def create_key(body: KeyCreate, keys: KeysDep) -> KeyPublic:
    key, info = keys.create(body.tenant, body.require_approval)
    return KeyPublic(**info.__dict__, key=key)


@router.get("/keys", response_model=list[KeyPublic], responses=_RESPONSES, summary="List API keys (never the keys)")
def list_keys(keys: KeysDep) -> list[KeyPublic]:
    return [KeyPublic(**info.__dict__) for info in keys.list()]


@router.delete("/keys/{key_id}", status_code=204, responses=_RESPONSES, summary="Revoke an API key")
def revoke_key(
    key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{8}$", description="Key id.")],
    keys: KeysDep,
) -> None:
    if not keys.revoke(key_id):
        raise KeyNotFound(key_id)


@router.post("/scripts", status_code=201, response_model=ScriptVersion, responses=_RESPONSES,
             summary="Publish a shared script version every tenant may find and invoke")  # fmt: skip
def publish_script(body: ScriptCreate, library: LibraryDep, policies: PoliciesDep) -> ScriptVersion:
    stored, _ = library.register(SHARED, body, policies.names)
    return stored


@router.post("/scripts/{name}/versions/{version}/promote", response_model=ScriptVersion, responses=_RESPONSES,
             summary="Promote a shared script version on evidence from any tenant's executions")  # fmt: skip
def promote_shared(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    version: Annotated[str, Path(pattern=VERSION_PATTERN)],
    body: Promote,
    library: LibraryDep,
) -> ScriptVersion:
    return library.promote(SHARED, name, version, body)


NodeName = Annotated[
    str,
    Path(pattern=NODE_PATTERN, max_length=128, description="Node name, as workers report it (EXECBOX_WORKER__NODE)."),
]


def _nodes(fleet: WorkerRegistry) -> Nodes:
    return Nodes(fleet.redis, fleet.keys)


@router.get("/nodes", response_model=list[NodePublic], responses=_RESPONSES,
            summary="Every node: live workers, drained or not, executions running and finished")  # fmt: skip
def list_nodes(fleet: FleetDep, store: StoreDep) -> list[NodePublic]:
    return [NodePublic.of(view) for view in _nodes(fleet).overview(store.holders())]


@router.post("/nodes/{node}/drain", response_model=NodePublic, responses=_RESPONSES,
             summary="Drain a node: its workers finish what they run and take nothing new")  # fmt: skip
def drain_node(node: NodeName, fleet: FleetDep, store: StoreDep) -> NodePublic:
    nodes = _nodes(fleet)
    nodes.drain(node)
    return NodePublic.of(nodes.view(node, store.holders()))


@router.delete("/nodes/{node}/drain", response_model=NodePublic, responses=_RESPONSES,
               summary="Undrain a node: its workers take work again")  # fmt: skip
def undrain_node(node: NodeName, fleet: FleetDep, store: StoreDep) -> NodePublic:
    nodes = _nodes(fleet)
    nodes.undrain(node)
    return NodePublic.of(nodes.view(node, store.holders()))
