"""Turn a request's input files, stdin and JSON inputs into stored, size-checked parts (API side).

Every cap is the applied policy's; passing one is a 422 that names the field. Inline files become
file objects in the store, exactly like uploads, so the worker has one way to fetch them.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from execbox.catalog.errors import PolicyExceeded
from execbox.catalog.schemas import AppliedPolicy
from execbox.core.errors import FieldProblem, InvalidRequest
from execbox.executions.schemas import ExecutionCreate
from execbox.files.schemas import InputFileRef
from execbox.files.store import FileStore

INPUTS_FILE = ".execbox/inputs.json"


@dataclass(frozen=True)
class PreparedInputs:
    files: list[InputFileRef]
    stdin_b64: str


def _b64(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"{field} is not valid base64", (FieldProblem(field, "not valid base64"),)) from exc


def prepare(
    body: ExecutionCreate,
    policy: AppliedPolicy,
    code_file: str,
    files: FileStore,
    extra: list[tuple[str, bytes]],
    keep_until: float,
    ttl_s: int,
    tenant: str,
) -> PreparedInputs:
    """Check caps, store inline and multipart files, and return references for the record.

    `extra` are multipart parts (path, bytes), checked exactly like JSON files.
    """
    problems: list[FieldProblem] = []
    refs: list[InputFileRef] = []
    pending: list[tuple[str, bytes]] = []
    total = 0
    paths = [f.path for f in body.files] + [p for p, _ in extra]
    if len(paths) > policy.input_files:
        problems.append(
            FieldProblem(
                "files",
                f"{len(paths)} files is above the cap {policy.input_files} of policy "
                f"{policy.name!r}; raise policy.input_files or send fewer",
            )
        )
    if code_file in paths:
        problems.append(FieldProblem("files", f"path {code_file!r} is where the code goes; rename the file"))
    if len(set(paths)) != len(paths):
        problems.append(FieldProblem("files", "two input files have the same path"))
    for index, item in enumerate(body.files):
        field = f"files.{index}"
        if item.file_id is not None:
            meta = files.meta(item.file_id)
            if meta is None or meta.tenant != tenant:
                problems.append(
                    FieldProblem(
                        f"{field}.file_id",
                        f"no file {item.file_id}; it never existed or expired; upload it again with POST /v1/files",
                    )
                )
                continue
            size = meta.size
            refs.append(InputFileRef(path=item.path, file_id=meta.id, size=meta.size, sha256=meta.sha256))
        else:
            data = _b64(item.content_b64 or "", f"{field}.content_b64")
            size = len(data)
            pending.append((item.path, data))
        total += size
        if size > policy.input_file_bytes:
            problems.append(
                FieldProblem(
                    field,
                    f"{size} bytes is above the per-file cap {policy.input_file_bytes} "
                    f"of policy {policy.name!r}; raise policy.input_file_bytes or send less",
                )
            )
    for path, data in extra:
        total += len(data)
        pending.append((path, data))
        if len(data) > policy.input_file_bytes:
            problems.append(
                FieldProblem(
                    f"files[{path}]",
                    f"{len(data)} bytes is above the per-file cap {policy.input_file_bytes} of policy {policy.name!r}",
                )
            )
    if total > policy.input_total_bytes:
        problems.append(
            FieldProblem(
                "files",
                f"{total} bytes in all is above the cap {policy.input_total_bytes} of "
                f"policy {policy.name!r}; raise policy.input_total_bytes or send less",
            )
        )
    if total + len(body.code.encode()) > policy.disk_mb << 20:
        problems.append(
            FieldProblem(
                "files",
                f"the files ({total} bytes) do not fit in the working directory of "
                f"{policy.disk_mb} MiB; raise policy.disk_mb",
            )
        )
    stdin = _b64(body.stdin_b64, "stdin_b64") if body.stdin_b64 is not None else (body.stdin or "").encode()
    if len(stdin) > policy.stdin_bytes:
        problems.append(
            FieldProblem(
                "stdin",
                f"{len(stdin)} bytes is above the cap {policy.stdin_bytes} of policy "
                f"{policy.name!r}; raise policy.stdin_bytes or send an input file",
            )
        )
    if body.inputs is not None and len(json.dumps(body.inputs)) > policy.input_file_bytes:
        problems.append(
            FieldProblem(
                "inputs",
                f"inputs serialize to more than {policy.input_file_bytes} bytes; send large data as an input file",
            )
        )
    if problems:
        raise PolicyExceeded(tuple(problems))
    for path, data in pending:
        meta = files.put(data, path.rsplit("/", 1)[-1], ttl_s, tenant, counted=False)  # counted with the execution
        refs.append(InputFileRef(path=path, file_id=meta.id, size=meta.size, sha256=meta.sha256))
    for ref in refs:
        files.keep(ref.file_id, keep_until)
    return PreparedInputs(files=refs, stdin_b64=base64.b64encode(stdin).decode())
