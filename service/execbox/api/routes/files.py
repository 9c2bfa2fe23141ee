"""POST /v1/files (upload once, use by id in many executions), GET /v1/files/{id}."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from execbox.api.bodies import OffLoopRoute
from execbox.api.deps import FilesDep, IdempotencyDep, PoliciesDep, SettingsDep, TenantDep
from execbox.api.params import IdempotencyHeader
from execbox.api.problems import PROBLEM_DOC, UNAUTHORIZED_DOC
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.files.errors import FileNotFound
from execbox.files.schemas import FilePublic

router = APIRouter(prefix="/v1/files", tags=["files"], route_class=OffLoopRoute)
_PROBLEM = PROBLEM_DOC
_UPLOAD = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {"file": {"type": "string", "format": "binary", "description": "The file's bytes."}},
            }
        }
    },
}


@router.post(
    "",
    status_code=201,
    response_model=FilePublic,
    summary="Upload a file to use in executions by id",
    responses={
        400: {"description": "Not a well-formed multipart body.", **_PROBLEM},
        413: {"description": "Too large.", **_PROBLEM},
        422: {"description": "No file part.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
    openapi_extra={"requestBody": _UPLOAD},
)
async def upload_file(
    request: Request,
    response: Response,
    settings: SettingsDep,
    policies: PoliciesDep,
    files: FilesDep,
    idempotency: IdempotencyDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyHeader = None,
) -> FilePublic:
    form = await request.form(max_files=1, max_fields=1)
    part = form.get("file")
    if not isinstance(part, UploadFile):
        raise InvalidRequest("send the file as a multipart part named `file`", (FieldProblem("file", "missing"),))
    cap = policies.max_ceiling("input_file_bytes")
    # The parser has spooled the part to a temporary file (memory up to 1 MiB, then disk): it is read
    # from there in chunks, for its fingerprint and into the store, never whole into memory.
    if part.size is None or part.size > cap:
        raise InvalidRequest(
            f"the file is larger than {cap} bytes, the largest any policy accepts",
            (FieldProblem("file", f"at most {cap} bytes"),),
        )
    name = (part.filename or "upload").rsplit("/", 1)[-1][:255]
    ttl = settings.retention_s
    spooled = part.file

    def fingerprint() -> str:
        digest = hashlib.sha256(name.encode() + b"\0")
        spooled.seek(0)
        while chunk := spooled.read(1 << 16):
            digest.update(chunk)
        return digest.hexdigest()

    def put() -> FilePublic:
        spooled.seek(0)
        return files.put(spooled, name, ttl, tenant, limit=cap)

    def stored(file_id: str) -> FilePublic:
        meta = files.meta(file_id)
        if meta is None:
            raise FileNotFound(file_id)
        return meta

    def create() -> tuple[FilePublic, bool]:
        return idempotency.once(
            tenant, "POST /v1/files", idempotency_key, fingerprint, put, lambda meta: meta.id, stored
        )

    try:
        meta, replayed = await run_in_threadpool(create)
    finally:  # refused too (the tenant's storage budget): the spooled part is not left to the collector
        await form.close()
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return meta


@router.get(
    "/{file_id}",
    response_model=FilePublic,
    summary="An uploaded file's metadata",
    responses={
        404: {"description": "Unknown or expired.", **_PROBLEM},
        422: {"description": "Bad id.", **_PROBLEM},
        **UNAUTHORIZED_DOC,
    },
)
def get_file(
    file_id: Annotated[str, Path(pattern=r"^file_[a-z0-9]{26}$", description="File id.")],
    files: FilesDep,
    tenant: TenantDep,
) -> FilePublic:
    meta = files.meta(file_id)
    if meta is None or meta.tenant != tenant:
        raise FileNotFound(file_id)
    return meta
