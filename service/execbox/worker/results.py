"""Everything a finished run leaves, folded into the execution record: status, error, output,
declared outputs, artifacts and expectations. Pure logic over the run's outcome (no Docker)."""

from __future__ import annotations

import base64
import fnmatch
import io
import json
from typing import Any
from urllib.parse import quote

from jsonschema import Draft202012Validator

from execbox.catalog.languages import ErrorRules
from execbox.core.status import ErrorCategory, ExecutionStatus
from execbox.executions.record import ExecutionRecord
from execbox.executions.schemas import (
    Artifact,
    ArtifactNotKept,
    ExecutionError,
    Resources,
    ResultData,
    RichResult,
    Timing,
)
from execbox.files.blobs import ArtifactStore, ArtifactTooLarge
from execbox.files.collect import Collector
from execbox.sandbox.runtime import Limits, RunOutcome
from execbox.worker.classify import classify

INLINE_OUTPUT_BYTES = 64 * 1024
OUTPUT_ARTIFACT_DIR = "execbox-outputs"
_STOPPED_FROM_OUTSIDE = {
    ErrorCategory.CANCELLED,
    ErrorCategory.LIMIT_TIMEOUT,
    ErrorCategory.LIMIT_OUTPUT,
    ErrorCategory.LIMIT_MEMORY,
    ErrorCategory.LIMIT_CPU,
}


def decode_stream(data: bytes, truncated: bool) -> tuple[str, str]:
    """(text, encoding): UTF-8 text when the bytes are UTF-8 (a character cut by the cap is
    dropped), else base64 of the exact bytes."""
    for cut in range(4 if truncated else 1):
        try:
            return data[: len(data) - cut].decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            continue
    return base64.b64encode(data).decode(), "base64"


def _error(category: ErrorCategory, text: str, **details: Any) -> ExecutionError:
    return ExecutionError(category=category, message=text, retryable=False, details=details)


def _parse_result(raw: bytes | None) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """(outputs, failed check, problem) from the program's result file."""
    if raw is None:
        return {}, None, None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return {}, None, f"the result file is not JSON ({exc})"
    if not isinstance(data, dict):
        return {}, None, "the result file is not a JSON object"
    outputs = data.get("outputs") or {}
    check = data.get("check")
    if not isinstance(outputs, dict) or (check is not None and not isinstance(check, dict)):
        return {}, None, "the result file's outputs or check has the wrong shape"
    return outputs, check, None


def _artifact(record_id: str, name: str, size: int, sha256: str, media_type: str) -> Artifact:
    url = f"/v1/executions/{record_id}/artifacts/{quote(name)}"
    return Artifact(name=name, size=size, sha256=sha256, media_type=media_type, url=url)


INLINE_TEXT_BYTES = 64 << 10


def rich_results(record_id: str, collector: Collector, store: ArtifactStore) -> list[RichResult]:
    """The kernel's index of rich results, joined to the representations that were kept."""
    try:
        index = json.loads(collector.rich_index or b"[]")
    except ValueError:
        return []
    results = []
    for entry in index if isinstance(index, list) else []:
        files = entry.get("files") if isinstance(entry, dict) else None
        data = {}
        for media_type, file in (files or {}).items():
            kept = collector.rich.get(str(file))
            if kept is None:
                continue
            text = None
            if (media_type.startswith("text/") or media_type == "application/json") and kept.size <= INLINE_TEXT_BYTES:
                text = b"".join(store.read(record_id, kept.name)).decode("utf-8", "replace")
            url = f"/v1/executions/{record_id}/results/{quote(str(file))}"
            data[media_type] = ResultData(media_type=media_type, size=kept.size, sha256=kept.sha256, url=url, text=text)
        if data:
            results.append(RichResult(kind=str(entry.get("kind", "display_data")), data=data))
    return results


def _inline_outputs(record: ExecutionRecord, outputs: dict[str, Any], store: ArtifactStore) -> dict[str, Any]:
    """Values too large to inline become artifacts of their own."""
    kept: dict[str, Any] = {}
    for name, value in outputs.items():
        encoded = json.dumps(value).encode()
        if len(encoded) <= INLINE_OUTPUT_BYTES:
            kept[name] = value
            continue
        artifact_name = f"{OUTPUT_ARTIFACT_DIR}/{quote(name, safe='')}.json"
        try:
            size, digest = store.put(record.id, artifact_name, io.BytesIO(encoded), len(encoded))
        except ArtifactTooLarge:
            continue
        record.artifacts.append(_artifact(record.id, artifact_name, size, digest, "application/json"))
        kept[name] = {"artifact": artifact_name, "size": size}
    return kept


def _unmet(record: ExecutionRecord, outcome: RunOutcome) -> list[str]:
    expect = record.expect
    if expect is None:
        return []
    unmet = []
    wanted_exit = expect.exit_code or 0
    if outcome.exit_code != wanted_exit:
        unmet.append(f"exit code was {outcome.exit_code}, expected {wanted_exit}")
    names = [a.name for a in record.artifacts]
    for pattern in expect.artifacts:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            unmet.append(f"no artifact matches {pattern!r}")
    if expect.outputs_schema is not None:
        validator = Draft202012Validator(expect.outputs_schema)
        for problem in sorted(validator.iter_errors(record.outputs), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in problem.absolute_path) or "(outputs)"
            unmet.append(f"outputs.{where}: {problem.message}" if where != "(outputs)" else problem.message)
    return unmet


def apply_outcome(
    record: ExecutionRecord,
    outcome: RunOutcome,
    collector: Collector | None,
    limits: Limits,
    store: ArtifactStore,
    errors: ErrorRules | None = None,
) -> ExecutionStatus:
    """Fill the record from the run and return its final status (`errors`: the language's error rules)."""
    verdict = classify(outcome, errors or record.language, limits)
    record.exit_code = outcome.exit_code
    record.signal = verdict.signal
    record.stdout, record.stdout_encoding = decode_stream(outcome.stdout, outcome.stdout_truncated)  # type: ignore[assignment]
    record.stderr, record.stderr_encoding = decode_stream(outcome.stderr, outcome.stderr_truncated)  # type: ignore[assignment]
    record.stdout_bytes, record.stderr_bytes = outcome.stdout_total, outcome.stderr_total
    record.stdout_truncated, record.stderr_truncated = outcome.stdout_truncated, outcome.stderr_truncated
    record.image = outcome.image_id
    record.resources = Resources(peak_memory_bytes=outcome.peak_memory_bytes, oom_killed=outcome.oom_killed)
    record.timing = Timing(
        queue_wait_ms=record.timing.queue_wait_ms,
        sandbox_start_ms=round(outcome.start_ms, 1),
        warm_start=outcome.warm,
        run_ms=round(outcome.run_ms, 1),
        collect_ms=round(outcome.collect_ms, 1),
    )
    outputs: dict[str, Any] = {}
    check = None
    result_problem = None
    if collector is not None:
        record.artifacts = [_artifact(record.id, a.name, a.size, a.sha256, a.media_type) for a in collector.kept]
        record.artifacts_not_kept = [ArtifactNotKept(**item) for item in collector.not_kept + collector.skipped]
        outputs, check, result_problem = _parse_result(collector.result)
        record.outputs = _inline_outputs(record, outputs, store)
        record.results = rich_results(record.id, collector, store)

    category = verdict.error.category if verdict.error else None
    expected_exit = record.expect is not None and record.expect.exit_code == outcome.exit_code
    if category in _STOPPED_FROM_OUTSIDE:
        record.error = verdict.error
        return verdict.status
    if check is not None:
        message = str(check.get("message", ""))[:4000]
        details = check.get("details") if isinstance(check.get("details"), dict) else {}
        record.error = _error(ErrorCategory.CHECK_FAILED, f"check failed: {message}", message=message, details=details)
        return ExecutionStatus.FAILED
    if verdict.error is not None and not expected_exit:
        record.error = verdict.error
        return ExecutionStatus.FAILED
    if outcome.collect_error:
        record.error = ExecutionError(
            category=ErrorCategory.SANDBOX_ERROR,
            message=outcome.collect_error,
            retryable=True,
            details={"reason": "collect_failed"},
        )
        return ExecutionStatus.FAILED
    if collector is not None and collector.over_cap:
        record.error = _error(
            ErrorCategory.LIMIT_ARTIFACTS,
            f"{len(collector.not_kept)} produced file(s) passed the artifact caps and were not kept; see "
            "artifacts_not_kept. Write fewer or smaller files, or raise policy.artifact_*",
            kept=[a.name for a in collector.kept],
            not_kept=collector.not_kept,
        )
        return ExecutionStatus.FAILED
    unmet = _unmet(record, outcome)
    if result_problem:
        unmet.append(result_problem)
    if unmet:
        record.error = _error(ErrorCategory.OUTPUT_INVALID, "unmet expectations: " + "; ".join(unmet), unmet=unmet)
        return ExecutionStatus.FAILED
    record.error = None
    return ExecutionStatus.SUCCEEDED


def blame_network(record: ExecutionRecord) -> None:
    """A run that failed after the egress proxy refused it something reports policy.network_denied
    (the refused hosts are in record.network.denied; the original category stays in the details)."""
    error = record.error
    if record.network is None or not record.network.denied or error is None:
        return
    if error.category in (ErrorCategory.SANDBOX_ERROR, ErrorCategory.CANCELLED):
        return
    hosts = sorted({f"{d.host}:{d.port}" for d in record.network.denied if d.host})
    record.error = ExecutionError(
        category=ErrorCategory.POLICY_NETWORK_DENIED,
        message=f"the program failed after the egress proxy refused {', '.join(hosts) or 'a connection'}: "
        f"{error.message}",
        retryable=False,
        details={**error.details, "original_category": error.category.value},
    )
