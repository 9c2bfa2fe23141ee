"""GET /v1/languages."""

from __future__ import annotations

from fastapi import APIRouter

from execbox.api.deps import ServicesDep
from execbox.models import LanguagesPublic

router = APIRouter(tags=["languages"])


@router.get("/v1/languages", response_model=LanguagesPublic, summary="Languages this service runs")
def list_languages(services: ServicesDep) -> LanguagesPublic:
    return LanguagesPublic(languages=[lang.public() for lang in services.languages])
