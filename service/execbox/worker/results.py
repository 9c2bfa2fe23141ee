"""Everything a finished run leaves, folded into the execution record: status, error, output,
declared outputs, artifacts and expectations. Pure logic over the run's outcome (no Docker).

What the program wrote (its result file, the rich results' index) and what the client asked for
(`expect.outputs_schema`) can be anything: whatever is wrong with them is the execution's outcome
(`output.invalid`, not retryable), never a failure of the worker reading them.
"""

from __future__ import annotations

import base64
import fnmatch
import io
import json
import logging
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
from execbox.files.collect import RICH_INDEX, Collector
from execbox.sandbox.runtime import Limits, RunOutcome
from execbox.worker.classify import classify

log = logging.getLogger(__name__)
INLINE_OUTPUT_BYTES = 64 * 1024
MAX_DEPTH = 34
"""Levels of nesting in the result file: {outputs: {name: ...}} leaves 32 to a value (a stored
record is read back by a parser that stops at a depth limit of its own)."""
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


def _depth(value: Any, limit: int) -> bool:
    """`value` (parsed JSON) nests no deeper than `limit` levels (looked at without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict | list):
            if level > limit:
                return False
            pending.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return True


def _parse_result(raw: bytes | None) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """(outputs, failed check, problem) from the program's result file."""
    if raw is None:
        return {}, None, None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return {}, None, f"the result file is not JSON ({type(exc).__name__}: {str(exc)[:200]})"
    if not isinstance(data, dict):
        return {}, None, "the result file is not a JSON object"
    outputs = data.get("outputs") or {}
    check = data.get("check")
    if not isinstance(outputs, dict) or (check is not None and not isinstance(check, dict)):
        return {}, None, "the result file's outputs or check has the wrong shape"
    if not _depth(data, MAX_DEPTH):
        # The record must read back: nesting past this is refused, not stored (its reader has a limit).
        return {}, None, f"the result file's outputs or check nest deeper than {MAX_DEPTH - 2} levels"
    return outputs, check, None


def _artifact(record_id: str, name: str, size: int, sha256: str, media_type: str) -> Artifact:
    url = f"/v1/executions/{record_id}/artifacts/{quote(name)}"
    return Artifact(name=name, size=size, sha256=sha256, media_type=media_type, url=url)


INLINE_TEXT_BYTES = 64 << 10


def rich_index(collector: Collector) -> tuple[list[dict[str, Any]], str | None]:
    """The entries of the rich results' index, and what is wrong with it (the program can write
    it: `[{kind, files: {media type: file name}}]`); no entries when it is wrong."""
    if collector.rich_index is None:
        return [], None
    try:
        index = json.loads(collector.rich_index)
    except (ValueError, RecursionError) as exc:
        return [], f"{RICH_INDEX} is not JSON ({type(exc).__name__})"
    if not isinstance(index, list) or not all(_rich_entry(entry) for entry in index):
        return [], f"{RICH_INDEX} has the wrong shape: expected [{{kind: string, files: {{media type: file name}}}}]"
    return index, None


def rich_results(record_id: str, collector: Collector, store: ArtifactStore) -> list[RichResult]:
    """The kernel's index of rich results, joined to the representations that were kept."""
    results = []
    for entry in rich_index(collector)[0]:
        data = {}
        for media_type, file in entry.get("files", {}).items():
            kept = collector.rich.get(file)
            if kept is None:
                continue
            text = None
            if (media_type.startswith("text/") or media_type == "application/json") and kept.size <= INLINE_TEXT_BYTES:
                text = b"".join(store.read(record_id, kept.name)).decode("utf-8", "replace")
            url = f"/v1/executions/{record_id}/results/{quote(file)}"
            data[media_type] = ResultData(media_type=media_type, size=kept.size, sha256=kept.sha256, url=url, text=text)
        if data:
            results.append(RichResult(kind=entry.get("kind", "display_data"), data=data))
    return results


def _rich_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("kind", ""), str):
        return False
    files = entry.get("files", {})
    return isinstance(files, dict) and all(isinstance(f, str) for f in files.values())


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
        try:
            validator = Draft202012Validator(expect.outputs_schema)
            problems = sorted(validator.iter_errors(record.outputs), key=lambda e: [str(p) for p in e.absolute_path])
        except Exception as exc:  # the client's schema (an unresolvable $ref, say): its outcome, not ours
            unmet.append(f"expect.outputs_schema cannot be applied ({type(exc).__name__}: {str(exc)[:300]})")
            return unmet
        for problem in problems:
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
    result_problems: list[str] = []
    if collector is not None:
        record.artifacts = [_artifact(record.id, a.name, a.size, a.sha256, a.media_type) for a in collector.kept]
        record.artifacts_not_kept = [ArtifactNotKept(**item) for item in collector.not_kept + collector.skipped]
        try:  # what the program wrote: nothing in it may fail the reading of its result
            outputs, check, result_problem = _parse_result(collector.result)
            record.outputs = _inline_outputs(record, outputs, store)
            record.results, rich_problem = rich_results(record.id, collector, store), rich_index(collector)[1]
            result_problems += [p for p in (result_problem, rich_problem) if p]
        except Exception as exc:
            log.exception("reading the program's result files failed")
            record.outputs, record.results, check = {}, [], None
            result_problems.append(f"the program's result files could not be read ({type(exc).__name__})")

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
    unmet = _unmet(record, outcome) + result_problems
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
