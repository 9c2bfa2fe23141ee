"""Issue #28, finding 14, from the program's side: what a program writes into its result files (the
rich results' index, the result file) and what its client declares (`expect.outputs_schema`) can be
anything; reading them never fails the worker (which the reaper then reported as a retryable
`sandbox.error`, worker lost): whatever is wrong is the execution's own outcome, not retryable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import Expect
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.files.blobs import LocalArtifactStore
from execbox.files.collect import ArtifactCaps, Collector
from tests.unit.test_results import EXE, LIMITS, apply_outcome, make_record, run


def collector(tmp_path: Path, index: Any = None, result: bytes | None = None) -> Collector:
    found = Collector(EXE, LocalArtifactStore(tmp_path), ArtifactCaps(1000, 5000, 10))
    found.rich_index = json.dumps(index).encode() if index is not None else None
    found.result = result
    return found


@pytest.mark.parametrize(
    "index",
    [
        {"kind": "display_data"},  # an object, not a list
        [{"kind": "display_data", "files": ["0.png"]}],  # files a list
        [{"kind": "display_data", "files": "0.png"}],
        [{"kind": "display_data", "files": {"image/png": 7}}],  # a file name that is a number
        [{"kind": ["x"], "files": {}}],
        ["not an entry"],
    ],
)
def test_a_rich_results_index_of_the_wrong_shape_is_output_invalid_not_a_worker_failure(
    tmp_path: Path, index: Any
) -> None:
    record = make_record()
    status = apply_outcome(record, run(0), collector(tmp_path, index), LIMITS, LocalArtifactStore(tmp_path))
    assert status is ExecutionStatus.FAILED and record.error is not None
    assert record.error.category is ErrorCategory.OUTPUT_INVALID and record.error.retryable is False
    assert "index.json has the wrong shape" in record.error.message and record.results == []


def test_a_program_that_exits_3_with_a_broken_index_reports_its_exit_not_a_lost_worker(tmp_path: Path) -> None:
    record = make_record()
    index = [{"kind": "display_data", "files": ["0.png"]}]
    status = apply_outcome(record, run(3), collector(tmp_path, index), LIMITS, LocalArtifactStore(tmp_path))
    assert status is ExecutionStatus.FAILED and record.error is not None
    assert record.error.category is ErrorCategory.CODE_EXIT_NONZERO and record.error.retryable is False


def test_an_unresolvable_ref_in_the_outputs_schema_is_output_invalid(tmp_path: Path) -> None:
    record = make_record(expect=Expect(outputs_schema={"$ref": "#/$defs/missing"}))
    result = json.dumps({"outputs": {"total": 3}}).encode()
    status = apply_outcome(record, run(0), collector(tmp_path, result=result), LIMITS, LocalArtifactStore(tmp_path))
    assert status is ExecutionStatus.FAILED and record.error is not None
    assert record.error.category is ErrorCategory.OUTPUT_INVALID and record.error.retryable is False
    assert "expect.outputs_schema cannot be applied" in record.error.message, record.error.message


@pytest.mark.parametrize("depth", [40, 100_000])
def test_outputs_nested_too_deep_for_the_record_to_read_back_are_output_invalid(tmp_path: Path, depth: int) -> None:
    """Deeper than the stored record's reader accepts (the record would be stored and never read
    again), or deeper than the JSON parser's recursion: refused, and the record reads back."""
    nested = "[" * depth + "]" * depth
    result = ('{"outputs": {"deep": ' + nested + "}}").encode()
    record = make_record()
    status = apply_outcome(record, run(0), collector(tmp_path, result=result), LIMITS, LocalArtifactStore(tmp_path))
    assert status is ExecutionStatus.FAILED and record.error is not None
    assert record.error.category is ErrorCategory.OUTPUT_INVALID and record.outputs == {}
    assert ExecutionRecord.model_validate_json(record.model_dump_json()).error == record.error


def test_outputs_nested_within_the_limit_are_kept_and_read_back(tmp_path: Path) -> None:
    value: Any = "leaf"
    for _ in range(30):
        value = {"k": value}
    record = make_record()
    result = json.dumps({"outputs": {"deep": value}}).encode()
    status = apply_outcome(record, run(0), collector(tmp_path, result=result), LIMITS, LocalArtifactStore(tmp_path))
    assert status is ExecutionStatus.SUCCEEDED, record.error
    assert ExecutionRecord.model_validate_json(record.model_dump_json()).outputs == {"deep": value}
