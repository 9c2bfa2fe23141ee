"""Issue #28, finding 14, in a real sandbox: a program that writes a rich results' index of the wrong
shape and exits 3, or whose client's `expect.outputs_schema` has a `$ref` that resolves nowhere,
gets its own outcome on its first attempt, not a retryable sandbox.error after its worker is lost (the
schema is now refused at submission, issue 44)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.redis]
BROKEN_INDEX = """
import os
os.makedirs("out/.execbox/results", exist_ok=True)
with open("out/.execbox/results/index.json", "w") as index:
    index.write('[{"kind": "display_data", "files": ["0.png"]}]')
raise SystemExit(3)
"""


def run(api: httpx.Client, request: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/v1/executions?wait=60", json={"language": "python", **request})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_what_a_program_writes_or_its_schema_declares_is_its_own_outcome_not_a_lost_worker(api: httpx.Client) -> None:
    broken_index = run(api, {"code": BROKEN_INDEX})
    assert broken_index["status"] == "failed" and broken_index["attempt"] == 1, broken_index
    assert broken_index["error"]["category"] == "code.exit_nonzero", broken_index["error"]
    assert broken_index["error"]["retryable"] is False and broken_index["exit_code"] == 3

    # Since issue 44 such a schema is refused at submission, naming the field, and nothing runs.
    refused = api.post(
        "/v1/executions?wait=60",
        json={"language": "python", "code": "print(1)", "expect": {"outputs_schema": {"$ref": "#/$defs/missing"}}},
    )
    assert refused.status_code == 422 and "expect.outputs_schema" in refused.text, refused.text
