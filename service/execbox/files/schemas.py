"""Input files: where they may go in the working directory, and the stored file objects."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

INPUT_PATH_PATTERN = r"^(?!/)(?!.*(?:^|/)\.{1,2}(?:/|$))(?!.*//)[^\x00-\x1f\x7f\\]{1,1024}$"
RESERVED_PATHS = (".execbox", "out/.execbox")


def check_input_path(path: str) -> str:
    """A relative path under /workspace: no absolute path, `..`, `.`, empty part, NUL or control character."""
    if not re.match(INPUT_PATH_PATTERN, path):
        raise ValueError(
            f"path {path!r} must be relative to the working directory, without '..', '.', empty parts, "
            "a leading '/', backslashes or control characters"
        )
    if any(path == r or path.startswith(r + "/") for r in RESERVED_PATHS):
        raise ValueError(f"path {path!r} is inside a directory execbox reserves ({', '.join(RESERVED_PATHS)})")
    if any(len(part) > 255 for part in path.split("/")):
        raise ValueError(f"path {path!r} has a part longer than 255 characters")
    return path


class InputFileRef(BaseModel):
    path: str = Field(description="Path under the working directory.")
    file_id: str = Field(description="Stored file object.")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="SHA-256, hex.")


class FilePublic(BaseModel):
    """An uploaded file, usable by id in many executions until it expires."""

    id: str = Field(description="File id, `file_` followed by 26 characters.")
    name: str = Field(description="The uploaded file's name (informational).")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="SHA-256 of the content, hex.")
    created_at: float = Field(description="Unix time of the upload.")
    expires_at: float = Field(description="Unix time after which it is gone.")
    tenant: str = Field("default", description="Tenant that owns it.")
