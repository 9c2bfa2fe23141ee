"""Folding a run into the record: precedence of verdicts, outputs, encodings (no Docker)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from execbox.catalog.languages import ErrorRules
from execbox.catalog.policies import PolicySet
from execbox.executions.outcome import decide, decode_stream
from execbox.executions.outputs import INLINE_OUTPUT_BYTES, read_files
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import ExecutionCreate, Expect
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.files.blobs import ArtifactStore, LocalArtifactStore
from execbox.files.collect import ArtifactCaps, Collector
from execbox.sandbox.runtime import Limits, SandboxOutcome
from tests.unit.test_policies import ROOT

LIMITS = Limits(timeout_s=5, cpu=1, cpu_time_s=3, memory_mb=64, pids=16, disk_mb=8, output_bytes=1000)
EXE = "exe_" + "b" * 26


def record(expect: Expect | None = None) -> ExecutionRecord:
    return make_record(expect=expect)


def make_record(**fields: Any) -> ExecutionRecord:
    """A minimal valid record under the shipped default policy; `fields` override."""
    policy = PolicySet.load(ROOT / "policies").resolve(ExecutionCreate(language="python", code="x").policy, 1)
    base: dict[str, Any] = {"id": EXE, "status": ExecutionStatus.RUNNING, "language": "python",
                            "trace_id": "1" * 32, "created_at": 0.0, "policy": policy, "code": "x",
                            "request_sha256": "0" * 64, "queue_deadline": 1.0}  # fmt: skip
    return ExecutionRecord(**(base | fields))


def apply_outcome(
    rec: ExecutionRecord,
    outcome: SandboxOutcome,
    found: Collector | None,
    limits: Limits,
    store: ArtifactStore,
    errors: ErrorRules | None = None,
) -> ExecutionStatus:
    """The lifecycle's outcome step on its own: read the files, decide, apply to the record."""
    files = read_files(rec.id, found, store) if found is not None else None
    return decide(rec, outcome, files, limits, errors).apply(rec)


def run(exit_code: int = 0, **kw: Any) -> SandboxOutcome:
    return SandboxOutcome(exit_code=exit_code, stdout=b"", stderr=b"", stdout_total=0, stderr_total=0, **kw)


def collector(tmp_path: Path, result: dict[str, Any] | None = None, over_cap: bool = False) -> Collector:
    c = Collector(EXE, LocalArtifactStore(tmp_path), ArtifactCaps(10, 10, 1))
    c.result = json.dumps(result).encode() if result is not None else None
    c.over_cap = over_cap
    return c


def test_check_wins_over_the_nonzero_exit_it_causes(tmp_path: Path) -> None:
    rec = record()
    status = apply_outcome(
        rec,
        run(1),
        collector(tmp_path, {"outputs": {}, "check": {"message": "m", "details": {"k": 2}}}),
        LIMITS,
        LocalArtifactStore(tmp_path),
    )
    assert status is ExecutionStatus.FAILED and rec.error is not None
    assert rec.error.category is ErrorCategory.CHECK_FAILED and rec.error.details == {
        "message": "m",
        "details": {"k": 2},
    }


def test_timeout_wins_over_a_check(tmp_path: Path) -> None:
    rec = record()
    apply_outcome(
        rec,
        run(137, timed_out=True),
        collector(tmp_path, {"check": {"message": "m"}}),
        LIMITS,
        LocalArtifactStore(tmp_path),
    )
    assert rec.error is not None and rec.error.category is ErrorCategory.LIMIT_TIMEOUT


def test_expected_exit_code_turns_failure_into_success(tmp_path: Path) -> None:
    rec = record(Expect(exit_code=3))
    assert apply_outcome(rec, run(3), collector(tmp_path), LIMITS, LocalArtifactStore(tmp_path)) is (
        ExecutionStatus.SUCCEEDED
    )


def test_artifact_caps_fail_an_otherwise_good_run(tmp_path: Path) -> None:
    rec = record()
    apply_outcome(rec, run(0), collector(tmp_path, over_cap=True), LIMITS, LocalArtifactStore(tmp_path))
    assert rec.error is not None and rec.error.category is ErrorCategory.LIMIT_ARTIFACTS


def test_malformed_result_file_is_output_invalid(tmp_path: Path) -> None:
    rec = record()
    c = collector(tmp_path)
    c.result = b"{not json"
    apply_outcome(rec, run(0), c, LIMITS, LocalArtifactStore(tmp_path))
    assert rec.error is not None and rec.error.category is ErrorCategory.OUTPUT_INVALID


def test_large_output_becomes_artifact(tmp_path: Path) -> None:
    rec = record()
    big = "x" * (INLINE_OUTPUT_BYTES + 1)
    apply_outcome(
        rec, run(0), collector(tmp_path, {"outputs": {"big": big, "n": 1}}), LIMITS, LocalArtifactStore(tmp_path)
    )
    assert rec.outputs["n"] == 1 and rec.outputs["big"]["artifact"] == "execbox-outputs/big.json"
    assert [a.name for a in rec.artifacts] == ["execbox-outputs/big.json"]


@pytest.mark.parametrize(
    ("data", "truncated", "expected"),
    [
        (b"plain\n", False, ("plain\n", "utf-8")),
        ("é".encode() * 3 + "é".encode()[:1], True, ("ééé", "utf-8")),  # a character cut by the cap
        (b"\xff\xfe", False, (base64.b64encode(b"\xff\xfe").decode(), "base64")),
    ],
)
def test_decode_stream(data: bytes, truncated: bool, expected: tuple[str, str]) -> None:
    assert decode_stream(data, truncated) == expected
