"""Idempotency keys through the API of the in-process stack (tests/unit/stack.py): a retry replays,
another body under the key is refused, a refused request leaves the key free, an upload's retries
return the first file. Moved from tests/integration/test_idempotency.py (issue 45), which keeps
fifty concurrent retries over real connections to the real API; the key store itself is
tests/unit/test_idempotency_keys.py."""

from __future__ import annotations

import pytest

from tests.unit.stack import InStack

pytestmark = pytest.mark.redis


def queued_jobs(inproc: InStack) -> int:
    return int(inproc.redis.llen(f"rq:queue:{inproc.settings.queue.name}"))


def test_same_key_different_body_is_refused(inproc: InStack) -> None:
    with inproc.client() as client:
        first = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "k1"}
        )
        assert first.status_code == 202 and "idempotent-replayed" not in first.headers, first.text
        again = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "k1"}
        )
        assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
        other = client.post(
            "/v1/executions", json={"language": "python", "code": "print(2)"}, headers={"Idempotency-Key": "k1"}
        )
        assert other.status_code == 422 and other.json()["code"] == "idempotency.mismatch"
        bad = client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers={"Idempotency-Key": "has space"}
        )
        assert bad.status_code == 422 and "header.Idempotency-Key" in {e["field"] for e in bad.json()["errors"]}
    assert queued_jobs(inproc) == 1, "the replay, the mismatch and the bad key created nothing"


def test_refused_request_does_not_burn_the_key(inproc: InStack) -> None:
    with inproc.client() as client:
        refused = client.post(
            "/v1/executions",
            json={"language": "python", "code": "x", "policy": {"pids": 9999}},
            headers={"Idempotency-Key": "k2"},
        )
        assert refused.status_code == 422, refused.text
        fixed = client.post(
            "/v1/executions", json={"language": "python", "code": "x"}, headers={"Idempotency-Key": "k2"}
        )
        assert fixed.status_code == 202 and "idempotent-replayed" not in fixed.headers, fixed.text
    assert queued_jobs(inproc) == 1


def test_file_upload_retries_return_the_first_file(inproc: InStack) -> None:
    with inproc.client() as client:
        uploads = [
            client.post("/v1/files", files={"file": ("a.csv", b"x,y\n")}, headers={"Idempotency-Key": "up-1"})
            for _ in range(3)
        ]
        assert {u.status_code for u in uploads} <= {200, 201}, [u.text for u in uploads]
        assert len({u.json()["id"] for u in uploads}) == 1
        other = client.post("/v1/files", files={"file": ("a.csv", b"changed")}, headers={"Idempotency-Key": "up-1"})
        assert other.status_code == 422 and other.json()["code"] == "idempotency.mismatch"
