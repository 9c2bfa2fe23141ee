"""Fuzz the API from its own OpenAPI document (schemathesis): no 5xx, nothing off-spec.

Against an API with no worker on its queue (executions stay queued, so random programs never run)
and a 1 s wait ceiling. /readyz is left out: without workers it answers 503 by design, which
test_observability covers. `positive_data_acceptance` is left out because limits come from server
policies and settings (ceilings, the wait ceiling) that a schema cannot express; each such refusal
is a documented 422.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Side

pytestmark = [pytest.mark.redis, pytest.mark.slow]
CONFIG = Path(__file__).with_name("schemathesis.toml")
"""413 is a rejection of a schema-violating body too: above its route's bound, it is refused unread."""


def test_openapi_fuzzing_finds_no_server_error_or_spec_violation(side_stack: Callable[..., Side]) -> None:
    side = side_stack(EXECBOX_API__MAX_WAIT_S="1")
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is missing: run scripts/install"
    try:
        done = subprocess.run(
            [st, "--config-file", str(CONFIG), "run", f"{side.base_url}/openapi.json", "--checks", "all",
             "--exclude-checks", "positive_data_acceptance", "--exclude-path", "/readyz", "--phases",
             "examples,fuzzing", "--max-examples", "25", "--seed", "1", "--workers", "1", "--header",
             f"Authorization: Bearer {side.key}"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        _end_open_sessions(side)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def _end_open_sessions(side: Side) -> None:
    """The sessions the fuzzer opened on the side stack's queue would wait there, starting, once its
    workers are gone, and hold the tenant's share of the shared fleet's slots for later tests."""
    with side.client() as client:
        for status in ("starting", "ready"):
            for opened in client.get("/v1/sessions", params={"status": status}).json()["sessions"]:
                client.delete(f"/v1/sessions/{opened['id']}")
