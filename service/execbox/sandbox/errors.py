"""The sandbox room's errors: the engine or an image is not available (retryable). Codes are listed in
docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import InfrastructureError


class RuntimeUnavailable(InfrastructureError):
    code = "sandbox.runtime_unavailable"


class ImageUnavailable(InfrastructureError):
    code = "sandbox.image_unavailable"


RUN_FAILURES: tuple[type[InfrastructureError], ...] = (RuntimeUnavailable, ImageUnavailable)
"""Every error a sandbox run can fail with before the program starts: the worker exports each code as a
label of execbox_sandbox_failures_total from its start, so a new one is added here and nowhere else."""

__all__ = ["RUN_FAILURES", "ImageUnavailable", "RuntimeUnavailable"]
