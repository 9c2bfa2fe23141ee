"""The S3 artifact store's own checks, none of which needs an object store: its settings, the ids it
refuses before any request, how a store that cannot be reached fails, and the calls it makes. Its contract with a real
store is tests/integration/test_s3_artifacts.py."""

from __future__ import annotations

import hashlib
import io
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

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


# The store's own logic against botocore's Stubber: each S3 call it makes, in order, with what it
# sends, answered without a server (the real exchange is tests/integration/test_s3_artifacts.py).

MiB = 1 << 20
EID = "exe_" + "a" * 26


@pytest.fixture
def stubbed() -> Iterator[tuple[S3ArtifactStore, Stubber]]:
    store = S3ArtifactStore(
        endpoint="http://127.0.0.1:9", bucket="artifacts", prefix="p", access_key="k", secret_key="s"
    )
    with Stubber(store.client()) as stubber:
        yield store, stubber
        stubber.assert_no_pending_responses()


def key(name: str) -> str:
    return f"p/{EID}/{hashlib.sha256(name.encode()).hexdigest()}"


def test_a_small_artifact_is_one_put_with_its_checksum(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    data = b"hello"
    sha256 = hashlib.sha256(data).hexdigest()
    stubber.add_response("put_object", {}, {"Bucket": "artifacts", "Key": key("a.txt"), "Body": ANY,
                                            "Metadata": {"sha256": sha256}})  # fmt: skip
    assert store.put(EID, "a.txt", io.BytesIO(data), limit=10) == (5, sha256)


def test_a_large_artifact_goes_in_parts_then_gets_its_checksum(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    data = bytes(range(256)) * (11 * MiB // 256)  # an 8 MiB part and a short last one
    sha256 = hashlib.sha256(data).hexdigest()
    stubber.add_response("create_multipart_upload", {"UploadId": "u1"}, {"Bucket": "artifacts", "Key": key("big")})
    for number in (1, 2):
        stubber.add_response("upload_part", {"ETag": f'"e{number}"'}, {"Bucket": "artifacts", "Key": key("big"),
                             "UploadId": "u1", "PartNumber": number, "Body": ANY})  # fmt: skip
    parts = [{"PartNumber": 1, "ETag": '"e1"'}, {"PartNumber": 2, "ETag": '"e2"'}]
    stubber.add_response("complete_multipart_upload", {}, {"Bucket": "artifacts", "Key": key("big"), "UploadId": "u1",
                         "MultipartUpload": {"Parts": parts}})  # fmt: skip
    itself = {"Bucket": "artifacts", "Key": key("big")}
    stubber.add_response("copy_object", {}, {**itself, "CopySource": itself, "MetadataDirective": "REPLACE",
                                             "Metadata": {"sha256": sha256}})  # fmt: skip
    assert store.put(EID, "big", io.BytesIO(data), limit=len(data)) == (len(data), sha256)


def test_an_artifact_over_its_limit_aborts_the_upload(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_response("create_multipart_upload", {"UploadId": "u1"}, {"Bucket": "artifacts", "Key": key("big")})
    stubber.add_response("upload_part", {"ETag": '"e1"'}, {"Bucket": "artifacts", "Key": key("big"), "UploadId": "u1",
                         "PartNumber": 1, "Body": ANY})  # fmt: skip
    stubber.add_response("abort_multipart_upload", {}, {"Bucket": "artifacts", "Key": key("big"), "UploadId": "u1"})
    with pytest.raises(ArtifactTooLarge):
        store.put(EID, "big", io.BytesIO(b"x" * (10 * MiB)), limit=9 * MiB)


def test_a_refused_part_aborts_the_upload_and_fails_as_a_store_error(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_response("create_multipart_upload", {"UploadId": "u1"}, {"Bucket": "artifacts", "Key": key("big")})
    stubber.add_client_error("upload_part", "SlowDown", "reduce your request rate", 503)
    stubber.add_response("abort_multipart_upload", {}, {"Bucket": "artifacts", "Key": key("big"), "UploadId": "u1"})
    with pytest.raises(S3StoreError, match="upload_part failed: SlowDown"):
        store.put(EID, "big", io.BytesIO(b"x" * (9 * MiB)), limit=10 * MiB)


def test_absent_is_file_not_found_and_a_refusal_is_not(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_client_error("head_object", "404", "Not Found", 404)
    stubber.add_client_error("get_object", "NoSuchKey", "The specified key does not exist.", 404)
    stubber.add_client_error("head_object", "403", "Forbidden", 403)
    with pytest.raises(FileNotFoundError):
        store.size(EID, "gone")
    with pytest.raises(FileNotFoundError):
        b"".join(store.read(EID, "gone"))
    with pytest.raises(S3StoreError, match="head_object failed: 403"):
        store.size(EID, "gone")


def test_read_yields_the_body_in_chunks_and_size_is_the_stored_length(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    data = b"y" * 200_000
    stubber.add_response("get_object", {"Body": StreamingBody(io.BytesIO(data), len(data))},
                         {"Bucket": "artifacts", "Key": key("f")})  # fmt: skip
    stubber.add_response("head_object", {"ContentLength": len(data), "Metadata": {"sha256": "ab"}},
                         {"Bucket": "artifacts", "Key": key("f")})  # fmt: skip
    chunks = list(store.read(EID, "f"))
    assert b"".join(chunks) == data and max(len(c) for c in chunks) <= 1 << 16
    assert store.sha256(EID, "f") == "ab"


def test_retention_removes_executions_whose_newest_object_is_old(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    old, mixed, new = "exe_" + "o" * 26, "exe_" + "m" * 26, "exe_" + "n" * 26
    at = {10.0: datetime.fromtimestamp(10, UTC), 30.0: datetime.fromtimestamp(30, UTC)}
    listing = [(old, "1", 10.0), (old, "2", 10.0), (mixed, "1", 10.0), (mixed, "2", 30.0), (new, "1", 30.0)]
    contents = [{"Key": f"p/{e}/{n}", "LastModified": at[t], "Size": 1} for e, n, t in listing]
    prefix = {"Bucket": "artifacts", "Prefix": "p/"}
    # Listed lazily: the first execution is removed as soon as the listing reaches the next one.
    first_page = {"Contents": contents[:3], "IsTruncated": True, "NextContinuationToken": "t"}
    stubber.add_response("list_objects_v2", first_page, prefix)
    old_keys = [{"Key": f"p/{old}/1"}, {"Key": f"p/{old}/2"}]
    stubber.add_response("delete_objects", {}, {"Bucket": "artifacts", "Delete": {"Objects": old_keys, "Quiet": True}})
    last_page = {"Contents": contents[3:], "IsTruncated": False}
    stubber.add_response("list_objects_v2", last_page, {**prefix, "ContinuationToken": "t"})
    uploads = [{"Key": f"p/{old}/3", "UploadId": "stale", "Initiated": at[10.0]},
               {"Key": f"p/{new}/3", "UploadId": "young", "Initiated": at[30.0]}]  # fmt: skip
    stubber.add_response("list_multipart_uploads", {"Uploads": uploads}, prefix)
    stale = {"Bucket": "artifacts", "Key": f"p/{old}/3", "UploadId": "stale"}
    stubber.add_response("abort_multipart_upload", {}, stale)
    assert store.delete_older_than(20.0) == 1


def test_ensure_bucket_creates_only_a_missing_bucket(stubbed: tuple[S3ArtifactStore, Stubber]) -> None:
    store, stubber = stubbed
    # Three starts: the bucket exists; it does not (made); another process made it meanwhile.
    stubber.add_response("head_bucket", {}, {"Bucket": "artifacts"})
    stubber.add_client_error("head_bucket", "404", "Not Found", 404)
    stubber.add_response("create_bucket", {}, {"Bucket": "artifacts"})
    stubber.add_client_error("head_bucket", "404", "Not Found", 404)
    stubber.add_client_error("create_bucket", "BucketAlreadyOwnedByYou", "made meanwhile", 409)
    for _ in range(3):
        store.ensure_bucket()
