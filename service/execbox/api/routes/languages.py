"""GET /v1/languages."""

from __future__ import annotations

from fastapi import APIRouter

from execbox.api.deps import ServicesDep, TenantDep
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.catalog.schemas import LanguagesPublic

router = APIRouter(tags=["languages"])


@router.get(
    "/v1/languages",
    response_model=LanguagesPublic,
    summary="Languages this service runs",
    responses={422: {"description": "Malformed header.", **PROBLEM_DOC}, **UNAUTHORIZED_DOC},
)
def list_languages(services: ServicesDep, tenant: TenantDep) -> LanguagesPublic:
    return LanguagesPublic(languages=[lang.public() for lang in services.languages])
