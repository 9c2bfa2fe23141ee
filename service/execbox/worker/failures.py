"""The reasons a run that never got a sandbox fails with: the labels of execbox_sandbox_failures_total.

Every one is exported at zero from the worker's start, so a rate over a failure that has not happened
yet reads 0 rather than no data. The codes come from the rooms that raise them.
"""

from __future__ import annotations

from execbox.core.errors import InfrastructureError, ServiceError
from execbox.files.errors import InputStoreUnavailable, InputUnavailable
from execbox.sandbox.errors import RUN_FAILURES

SANDBOX_FAILURE_REASONS: tuple[str, ...] = (
    ServiceError.code,
    InfrastructureError.code,
    *(error.code for error in RUN_FAILURES),
    InputUnavailable.code,
    InputStoreUnavailable.code,
)

__all__ = ["SANDBOX_FAILURE_REASONS"]
