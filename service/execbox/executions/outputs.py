"""What a program left besides its streams, read into one value before its record is stored.

The collector has already kept the files of `out/` as artifact blobs; this step reads the rest:
the declared outputs and the check of its result file (an output too large to inline is written
here as an artifact of its own, so no blob is written inside the record's transaction), and its
rich results. What the program wrote can be anything: whatever is wrong with it becomes a
`problem` (the outcome step makes it `output.invalid`), never a failure of the worker reading it.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from execbox.executions.schemas import Artifact, ArtifactNotKept, ResultData, RichResult
from execbox.files.blobs import ArtifactStore, ArtifactTooLarge
from execbox.files.collect import RICH_INDEX, Collector
from execbox.files.media import media_type_problem

log = logging.getLogger(__name__)
INLINE_OUTPUT_BYTES = 64 * 1024
INLINE_TEXT_BYTES = 64 << 10
MAX_DEPTH = 34
"""Levels of nesting in the result file: {outputs: {name: ...}} leaves 32 to a value (a stored
record is read back by a parser that stops at a depth limit of its own)."""
OUTPUT_ARTIFACT_DIR = "execbox-outputs"


@dataclass(frozen=True)
class ProgramFiles:
    """The program's files as the record will show them."""

    artifacts: list[Artifact] = field(default_factory=list)
    """The collector's kept files, then the outputs too large to inline."""
    not_kept: list[ArtifactNotKept] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    results: list[RichResult] = field(default_factory=list)
    check: dict[str, Any] | None = None
    """The program's own verdict (`{message, details}`), when it failed its check."""
    problems: list[str] = field(default_factory=list)
    over_cap: bool = False
    """Some file passed the artifact caps."""
    passed_caps: list[dict[str, Any]] = field(default_factory=list)
    """What the collector did not keep (the caps' error lists it)."""
    kept: list[str] = field(default_factory=list)
    """The names the collector kept (what the caps' error lists)."""


def read_files(execution_id: str, collector: Collector, store: ArtifactStore) -> ProgramFiles:
    """Read what the collector gathered; writes only the blobs of outputs too large to inline."""
    artifacts = [artifact(execution_id, a.name, a.size, a.sha256, a.media_type) for a in collector.kept]
    not_kept = [ArtifactNotKept(**item) for item in collector.not_kept + collector.skipped]
    kept = [a.name for a in collector.kept]
    try:  # what the program wrote: nothing in it may fail the reading of its result
        outputs, check, result_problem = _parse_result(collector.result)
        outputs = _inline_outputs(execution_id, outputs, store, artifacts)
        results, rich_problem = rich_results(execution_id, collector, store), rich_index(collector)[1]
        problems = [p for p in (result_problem, rich_problem) if p]
    except Exception as exc:
        log.exception("reading the program's result files failed")
        outputs, results, check = {}, [], None
        problems = [f"the program's result files could not be read ({type(exc).__name__})"]
    return ProgramFiles(
        artifacts, not_kept, outputs, results, check, problems, collector.over_cap, collector.not_kept, kept
    )


def artifact(execution_id: str, name: str, size: int, sha256: str, media_type: str) -> Artifact:
    url = f"/v1/executions/{execution_id}/artifacts/{quote(name)}"
    return Artifact(name=name, size=size, sha256=sha256, media_type=media_type, url=url)


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


def _inline_outputs(
    execution_id: str, outputs: dict[str, Any], store: ArtifactStore, artifacts: list[Artifact]
) -> dict[str, Any]:
    """Values too large to inline become artifacts of their own (appended to `artifacts`)."""
    kept: dict[str, Any] = {}
    for name, value in outputs.items():
        encoded = json.dumps(value).encode()
        if len(encoded) <= INLINE_OUTPUT_BYTES:
            kept[name] = value
            continue
        artifact_name = f"{OUTPUT_ARTIFACT_DIR}/{quote(name, safe='')}.json"
        try:
            size, digest = store.put(execution_id, artifact_name, io.BytesIO(encoded), len(encoded))
        except ArtifactTooLarge:
            continue
        artifacts.append(artifact(execution_id, artifact_name, size, digest, "application/json"))
        kept[name] = {"artifact": artifact_name, "size": size}
    return kept


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
    # The media type becomes a download's Content-Type: a program's text must not reach a header.
    wrong = next((p for entry in index for media in entry.get("files", {}) if (p := media_type_problem(media))), None)
    if wrong is not None:
        return [], f"{RICH_INDEX}: {wrong}"
    return index, None


def rich_results(execution_id: str, collector: Collector, store: ArtifactStore) -> list[RichResult]:
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
                text = b"".join(store.read(execution_id, kept.name)).decode("utf-8", "replace")
            url = f"/v1/executions/{execution_id}/results/{quote(file)}"
            data[media_type] = ResultData(media_type=media_type, size=kept.size, sha256=kept.sha256, url=url, text=text)
        if data:
            results.append(RichResult(kind=entry.get("kind", "display_data"), data=data))
    return results


def _rich_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("kind", ""), str):
        return False
    files = entry.get("files", {})
    return isinstance(files, dict) and all(isinstance(f, str) for f in files.values())
