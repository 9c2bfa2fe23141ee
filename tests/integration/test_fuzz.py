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


def test_openapi_fuzzing_finds_no_server_error_or_spec_violation(side_stack: Callable[..., Side]) -> None:
    side = side_stack(EXECBOX_API__MAX_WAIT_S="1")
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is missing: run scripts/install"
    done = subprocess.run(
        [st, "run", f"{side.base_url}/openapi.json", "--checks", "all", "--exclude-checks", "positive_data_acceptance",
         "--exclude-path", "/readyz", "--phases", "examples,fuzzing", "--max-examples", "25", "--seed", "1",
         "--workers", "1", "--header", f"Authorization: Bearer {side.key}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
