"""GET /v1/languages and GET /v1/languages/{name}: what runs here, with the built images' versions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import LanguagesDep, TenantDep
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.catalog.errors import LanguageNotFound, UnknownLanguage
from execbox.catalog.schemas import LanguagePublic, LanguagesPublic

router = APIRouter(tags=["languages"], route_class=OffLoopRoute)
_MALFORMED: dict[int | str, dict[str, Any]] = {422: {"description": "Malformed header.", **PROBLEM_DOC}}


@router.get(
    "/v1/languages",
    response_model=LanguagesPublic,
    summary="Languages and image variants this service runs",
    responses={**_MALFORMED, **UNAUTHORIZED_DOC},
)
def list_languages(languages: LanguagesDep, tenant: TenantDep) -> LanguagesPublic:
    return LanguagesPublic(languages=[lang.public() for lang in languages])


@router.get(
    "/v1/languages/{name}",
    response_model=LanguagePublic,
    summary="One language or variant (`python`, `py`, `python@slim`), with its runtime and package versions",
    responses={404: {"description": "No such language or variant.", **PROBLEM_DOC}, **_MALFORMED, **UNAUTHORIZED_DOC},
)
def get_language(name: str, languages: LanguagesDep, tenant: TenantDep) -> LanguagePublic:
    try:
        return languages.get(name).public()
    except UnknownLanguage as exc:
        raise LanguageNotFound(name, [lang.name for lang in languages]) from exc
