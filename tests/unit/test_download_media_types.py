"""Issue 44 (low): a rich result's media type is the program's own text (the kernel's index names it) and
became the download's Content-Type: a CR/LF in it dropped the connection, and html or svg was served
without `nosniff`. Only RFC 6838 type/subtype names pass, and every download is an attachment the
browser may neither sniff nor run."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
import redis

from execbox.executions.schemas import ResultData, RichResult
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.executions.store import ExecutionStore
from execbox.files.blobs import LocalArtifactStore
from execbox.files.collect import RICH_DIR
from execbox.settings import Settings
from tests.unit.conftest import InProcess, make_record
from tests.unit.test_result_reading import collector
from tests.unit.test_results import LIMITS, apply_outcome, run
from tests.unit.test_results import make_record as make_run_record

HOSTILE = [
    "text/html\r\nSet-Cookie: session=attacker",
    "text/plain\nX-Injected: 1",
    "image/png\n",  # a trailing newline: `$` would have matched before it
    "text/html; charset=utf-8\r\n\r\n<script>",
    "text/html ",
    "text",
    "a/b/c",
    "",
    "x" * 200 + "/html",
]


@pytest.mark.parametrize("media_type", HOSTILE)
def test_a_rich_result_naming_a_media_type_outside_the_grammar_is_output_invalid(
    tmp_path: Path, media_type: str
) -> None:
    record = make_run_record()
    index = [{"kind": "display_data", "files": {media_type: "0.html"}}]

    status = apply_outcome(record, run(0), collector(tmp_path, index), LIMITS, LocalArtifactStore(tmp_path))

    assert status is ExecutionStatus.FAILED and record.error is not None
    assert record.error.category is ErrorCategory.OUTPUT_INVALID and record.error.retryable is False
    assert "media type" in record.error.message and record.results == []


def stored_result(settings: Settings, client: redis.Redis, media_type: str, content: bytes) -> str:
    """An execution of tenant alpha with one rich result of `media_type`, as a record kept before the
    check would hold it; its id."""
    record = make_record(settings)
    url = f"/v1/executions/{record.id}/results/0.bin"
    digest = hashlib.sha256(content).hexdigest()
    data = ResultData(media_type=media_type, size=len(content), sha256=digest, url=url)
    record.results = [RichResult(kind="display_data", data={media_type: data})]
    ExecutionStore(client, settings).create(record)
    LocalArtifactStore(settings.artifacts_dir).put(record.id, f"{RICH_DIR}0.bin", io.BytesIO(content), len(content))
    return record.id


@pytest.mark.parametrize("media_type", ["text/html", "image/svg+xml", "application/javascript", "text/xml"])
def test_an_active_representation_is_downloaded_as_an_attachment_never_sniffed_or_run(
    api: tuple[InProcess, dict[str, dict[str, str]]], settings: Settings, client: redis.Redis, media_type: str
) -> None:
    http, headers = api
    execution_id = stored_result(settings, client, media_type, b"<svg onload=alert(1)></svg>")

    answer = http.get(f"/v1/executions/{execution_id}/results/0.bin", headers=headers["alpha"])

    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert answer.headers["Content-Disposition"].startswith("attachment;")
    assert "sandbox" in answer.headers["Content-Security-Policy"]


@pytest.mark.parametrize("media_type", HOSTILE[:4])
def test_a_stored_media_type_outside_the_grammar_is_served_opaque(
    api: tuple[InProcess, dict[str, dict[str, str]]], settings: Settings, client: redis.Redis, media_type: str
) -> None:
    http, headers = api
    execution_id = stored_result(settings, client, media_type, b"hello")

    answer: Any = http.get(f"/v1/executions/{execution_id}/results/0.bin", headers=headers["alpha"])

    assert answer.status_code == 200 and answer.content == b"hello"
    assert answer.headers["Content-Type"] == "application/octet-stream"
    assert "set-cookie" not in answer.headers and "x-injected" not in answer.headers
