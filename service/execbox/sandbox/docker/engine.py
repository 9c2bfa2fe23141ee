"""The engine seam: docker SDK failures as the service's errors, and the engine's time stamps."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import requests
from docker.errors import DockerException, ImageNotFound

from execbox.core.errors import ImageUnavailable, RuntimeUnavailable


@contextmanager
def docker_errors() -> Iterator[None]:
    try:
        yield
    except ImageNotFound as exc:
        raise ImageUnavailable(
            f"sandbox image missing on this worker's engine ({exc.explanation}); build it with `make images`"
        ) from exc
    except (DockerException, requests.RequestException) as exc:
        raise RuntimeUnavailable(f"Docker engine unreachable or failing ({exc}); retry shortly") from exc


def unix_time(created: str) -> float:
    """The engine's RFC 3339 time (nanoseconds, Z or offset) as Unix time; 0 when unreadable."""
    try:
        stamp = re.sub(r"(\.\d{6})\d+", r"\1", created).replace("Z", "+00:00")
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0
