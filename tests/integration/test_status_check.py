"""The engine double-checks the launcher's reported status after the result (real engine)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from execbox.sandbox.docker import DockerRuntime
from execbox.sandbox.runtime import Limits, SandboxControl, SandboxSpec
from execbox.sandbox.settings import DockerSettings
from tests.conftest import Stack

pytestmark = [pytest.mark.docker]


def test_a_contradicted_launcher_report_is_detected(stack: Stack) -> None:
    runtime = DockerRuntime(DockerSettings())
    mismatches: list[str] = []
    runtime.on_status_mismatch = lambda: mismatches.append("!")
    spec = SandboxSpec(
        execution_id="exe_" + "s" * 26, trace_id="0" * 32, worker=f"{stack.prefix}-status-check",
        image="execbox/sandbox-python:latest", command=("python3", "main.py"),
        files=(("main.py", b"import sys\nsys.exit(3)\n"),), env=(),
        limits=Limits(10, 1.0, 10, 128, 32, 16, 1 << 16), deployment=stack.prefix,
    )  # fmt: skip
    made: list[str] = []
    try:
        # The engine agrees with a true report ...
        made.append(runtime.create(spec))
        honest = runtime.run_in(spec, SandboxControl(), made[-1], "", time.monotonic(), warm=False)
        assert honest.launcher_status and honest.exit_code == 3
        runtime.retire(made[-1], honest)
        assert mismatches == []
        # ... and contradicts a forged one (what a program knowing the nonce could have printed).
        made.append(runtime.create(spec))
        reported = runtime.run_in(spec, SandboxControl(), made[-1], "", time.monotonic(), warm=False)
        runtime.retire(made[-1], dataclasses.replace(reported, exit_code=0))
        assert mismatches == ["!"]
        assert not runtime.api.containers(all=True, filters={"id": made[-1]})
    finally:
        for cid in made:  # labelled with the run's execution: the suite's leftover check sees any miss
            runtime.remove(cid)
        runtime.api.close()
