"""The sandbox room's errors: the engine or an image is not available (retryable). Codes are listed in
docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import InfrastructureError


class RuntimeUnavailable(InfrastructureError):
    code = "sandbox.runtime_unavailable"


class ImageUnavailable(InfrastructureError):
    code = "sandbox.image_unavailable"


__all__ = ["ImageUnavailable", "RuntimeUnavailable"]
