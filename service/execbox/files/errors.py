"""The files room's errors: an input file or artifact that is not (or no longer) stored. Codes are listed in
docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import NotFound, RequestError, ServiceError


class ArtifactNotFound(NotFound):
    code = "artifact.not_found"

    def __init__(self, execution_id: str, name: str) -> None:  # two ids: its own message
        RequestError.__init__(self, f"execution {execution_id} has no artifact {name!r} (or it passed its retention)")


class FileNotFound(NotFound):
    code = "file.not_found"
    noun = "file"
    hint = "; it never existed or expired; upload it again"


class InputUnavailable(ServiceError):
    code = "sandbox.input_unavailable"
    retryable = True

    def __init__(self, path: str, file_id: str) -> None:
        super().__init__(f"input file {path} ({file_id}) is no longer stored; upload it again and resubmit")


__all__ = ["ArtifactNotFound", "FileNotFound", "InputUnavailable"]
