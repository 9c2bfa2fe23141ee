"""The files room's errors: an input file or artifact that is not (or no longer) stored. Codes are listed in
docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import InfrastructureError, NotFound, RequestError, ServiceError


class ArtifactNotFound(NotFound):
    code = "artifact.not_found"

    def __init__(self, execution_id: str, name: str) -> None:  # two ids: its own message
        RequestError.__init__(self, f"execution {execution_id} has no artifact {name!r} (or it passed its retention)")


class FileNotFound(NotFound):
    code = "file.not_found"
    noun = "file"
    hint = "; it never existed or expired; upload it again"


class InputUnavailable(ServiceError):
    """An input file that cannot be given as it was accepted: gone, or not the bytes it was. A retry
    of the same request meets the same file; a new upload is what helps."""

    code = "sandbox.input_unavailable"
    retryable = True

    def __init__(self, path: str, file_id: str, why: str = "it is no longer stored") -> None:
        super().__init__(f"input file {path} ({file_id}) cannot be used: {why}; upload it again and resubmit")


class InputStoreUnavailable(InfrastructureError):
    """The store holding input file data failed (or is not configured here): the file may be intact."""

    code = "file.store_unavailable"

    def __init__(self, path: str, file_id: str, why: str) -> None:
        super().__init__(
            f"input file {path} ({file_id}): {why}; retry later, or check the EXECBOX_ARTIFACTS__* settings"
        )


__all__ = ["ArtifactNotFound", "FileNotFound", "InputStoreUnavailable", "InputUnavailable"]
