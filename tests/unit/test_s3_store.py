"""The S3 artifact store's own checks, none of which needs an object store: its settings, the ids it
refuses before any request, and how a store that cannot be reached fails. Its contract with a real
store is tests/integration/test_s3_artifacts.py."""

from __future__ import annotations

import io
import socket
import time

import pytest

from execbox.files.blobs import ArtifactTooLarge
from execbox.files.s3 import S3ArtifactStore, S3StoreError


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unreachable(**kw: object) -> S3ArtifactStore:
    return S3ArtifactStore(
        endpoint=f"http://127.0.0.1:{closed_port()}", bucket="artifacts", access_key="k", secret_key="s",
        connect_timeout_s=1, max_attempts=1, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_part_smaller_than_s3_allows_is_refused() -> None:
    with pytest.raises(ValueError, match="5 MiB"):
        unreachable(part_size=1 << 20)


@pytest.mark.parametrize(
    ("given", "kept"), [("artifacts", "artifacts/"), ("/deploy/a/", "deploy/a/"), ("", ""), ("/", "")]
)
def test_the_key_prefix_is_one_clean_folder(given: str, kept: str) -> None:
    assert unreachable(prefix=given).prefix == kept


def test_making_a_store_contacts_nothing() -> None:
    # Nothing listens at the endpoint: a store that connected while being made would fail here.
    store = unreachable()
    assert store.bucket == "artifacts"


@pytest.mark.parametrize("bad", ["../exe_1", "exe_1/..", "a/b", "", "..", "exe 1", "exe_1\x00"])
def test_an_id_that_is_not_one_path_segment_is_refused_before_any_request(bad: str) -> None:
    # Refused with ValueError, not the S3StoreError a request to the closed port would give.
    store = unreachable()
    with pytest.raises(ValueError, match="bad execution id"):
        store.put(bad, "f", io.BytesIO(b"x"), limit=10)
    with pytest.raises(ValueError, match="bad execution id"):
        store.size(bad, "f")
    with pytest.raises(ValueError, match="bad execution id"):
        b"".join(store.read(bad, "f"))


def test_an_unreachable_store_fails_as_an_os_error_naming_the_operation() -> None:
    store = unreachable()
    started = time.monotonic()
    with pytest.raises(S3StoreError, match="put_object failed") as caught:
        store.put("exe_1", "f", io.BytesIO(b"x"), limit=10)
    assert isinstance(caught.value, OSError)
    with pytest.raises(S3StoreError, match="head_object failed"):
        store.size("exe_1", "f")
    with pytest.raises(S3StoreError, match="get_object failed"):
        b"".join(store.read("exe_1", "f"))
    assert time.monotonic() - started < 10  # bounded: one attempt each, a short connect timeout


def test_an_over_limit_artifact_is_refused_before_anything_is_sent() -> None:
    # The closed port would turn any request into S3StoreError: ArtifactTooLarge means none was made.
    with pytest.raises(ArtifactTooLarge):
        unreachable().put("exe_1", "f", io.BytesIO(b"x" * 11), limit=10)
