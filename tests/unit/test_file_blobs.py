"""Input files behind the blob seam: meta in Redis (the session's real redis-server), data in the Redis
hash or in a fake object store; reads checked against size and sha256; the S3 side's keys and sweep
against botocore's Stubber. The real exchange with SeaweedFS is tests/integration/test_s3_inputs.py."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest
import redis
from botocore.stub import ANY, Stubber

from execbox.core.errors import InfrastructureError
from execbox.files.backend import input_blobs, open_store
from execbox.files.blobs import ArtifactTooLarge, LocalArtifactStore
from execbox.files.errors import InputStoreUnavailable, InputUnavailable
from execbox.files.s3 import S3ArtifactStore, S3InputBlobs
from execbox.files.schemas import InputFileRef
from execbox.files.settings import ArtifactSettings
from execbox.files.store import FileStore, RedisHashBlobs, SweptBlobs, VerifiedInput, new_file_id
from execbox.keyschema import Keys
from execbox.settings import Settings
from execbox.worker import reaper
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_reaper_and_pool import context

pytestmark = pytest.mark.redis


class FakeBlobs:
    """An object store in a dict; `fail` makes every call raise as a store that is down would."""

    kind = "s3"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.stored_at: dict[str, float] = {}
        self.fail = False
        self.reads_per_put: list[int] = []

    def put(self, file_id: str, data: IO[bytes], limit: int, ttl_s: int) -> tuple[int, str]:
        if self.fail:
            raise OSError("connection refused")
        chunks, size = [], 0
        while chunk := data.read(1000):
            size += len(chunk)
            if size > limit:
                raise ArtifactTooLarge(file_id)
            chunks.append(chunk)
        self.reads_per_put.append(len(chunks))
        self.objects[file_id] = b"".join(chunks)
        self.stored_at[file_id] = 100.0
        return size, hashlib.sha256(self.objects[file_id]).hexdigest()

    def read(self, file_id: str) -> Iterator[bytes]:
        if self.fail:
            raise OSError("connection reset")
        if file_id not in self.objects:
            raise FileNotFoundError(file_id)
        data = self.objects[file_id]
        yield from (data[i : i + 7] for i in range(0, len(data), 7))

    def delete(self, file_id: str) -> None:
        self.objects.pop(file_id, None)

    def sweep(self, stored_before: float, alive: Callable[[list[str]], list[bool]]) -> int:
        if self.fail:
            raise OSError("list_objects_v2 failed")
        ids = sorted(i for i, at in self.stored_at.items() if at < stored_before and i in self.objects)
        gone = [i for i, live in zip(ids, alive(ids), strict=True) if not live]
        for file_id in gone:
            self.delete(file_id)
        return len(gone)


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.redis.key_prefix)


@pytest.fixture
def fake() -> FakeBlobs:
    return FakeBlobs()


@pytest.fixture
def remote(client: redis.Redis, keys: Keys, fake: FakeBlobs) -> FileStore:
    return FileStore(client, keys, fake)


def fields(client: redis.Redis, keys: Keys, file_id: str) -> dict[bytes, bytes]:
    return client.hgetall(keys.file(file_id))  # type: ignore[return-value]


def test_by_default_the_data_stays_in_the_hash_as_before(client: redis.Redis, keys: Keys) -> None:
    files = FileStore(client, keys)
    meta = files.put(b"a,b\n1,2\n", "data.csv", 60, "alpha")
    stored = fields(client, keys, meta.id)
    assert stored[b"data"] == b"a,b\n1,2\n" and stored[b"blob"] == b"redis"
    assert 0 < client.ttl(keys.file(meta.id)) <= 60
    assert files.data(meta.id) == b"a,b\n1,2\n"
    assert meta.sha256 == hashlib.sha256(b"a,b\n1,2\n").hexdigest() and meta.size == 8


def test_with_an_object_store_only_the_meta_and_its_place_are_in_redis(
    remote: FileStore, fake: FakeBlobs, client: redis.Redis, keys: Keys
) -> None:
    meta = remote.put(b"x" * 5000, "big.bin", 60, "alpha")
    stored = fields(client, keys, meta.id)
    assert set(stored) == {b"meta", b"blob"} and stored[b"blob"] == b"s3"
    assert 0 < client.ttl(keys.file(meta.id)) <= 60
    assert fake.objects[meta.id] == b"x" * 5000
    assert remote.data(meta.id) == b"x" * 5000
    assert remote.meta(meta.id) == meta


def test_a_stream_goes_to_the_store_in_chunks_up_to_its_limit(remote: FileStore, fake: FakeBlobs) -> None:
    meta = remote.put(io.BytesIO(b"y" * 4500), "s.bin", 60, "alpha", limit=5000)
    assert meta.size == 4500 and fake.reads_per_put == [5]
    with pytest.raises(ArtifactTooLarge):
        remote.put(io.BytesIO(b"y" * 5001), "s.bin", 60, "alpha", limit=5000)
    with pytest.raises(ValueError, match="limit"):
        remote.put(io.BytesIO(b"y"), "s.bin", 60, "alpha")


def test_the_redis_hash_refuses_past_the_limit_and_stores_nothing(client: redis.Redis, keys: Keys) -> None:
    files = FileStore(client, keys)
    with pytest.raises(ArtifactTooLarge):
        files.put(io.BytesIO(b"z" * 11), "z", 60, "alpha", limit=10)
    assert not list(client.scan_iter(match=keys.file("*")))


def test_a_hash_written_before_the_seam_still_reads_with_an_object_store(
    remote: FileStore, client: redis.Redis, keys: Keys
) -> None:
    # What every version before this one stored: meta and data in the hash, no `blob` field.
    old = FileStore(client, keys).put(b"old bytes", "old.txt", 60, "alpha")
    client.hdel(keys.file(old.id), "blob")
    assert remote.data(old.id) == b"old bytes"
    assert remote.meta(old.id) == old


def test_data_changed_behind_the_store_is_refused_by_its_checksum(remote: FileStore, fake: FakeBlobs) -> None:
    meta = remote.put(b"the real bytes", "r.txt", 60, "alpha")
    for changed, why in [(b"the fake bytes", "sha256"), (b"short", "bytes were stored"), (b"x" * 20, "more than")]:
        fake.objects[meta.id] = changed
        with pytest.raises(InputUnavailable, match=why) as caught:
            remote.data(meta.id)
        assert meta.id in caught.value.message and "upload it again" in caught.value.message


def test_data_removed_behind_the_store_is_input_unavailable(remote: FileStore, fake: FakeBlobs) -> None:
    meta = remote.put(b"soon gone", "g.txt", 60, "alpha")
    fake.delete(meta.id)
    with pytest.raises(InputUnavailable, match="no longer stored"):
        remote.data(meta.id)


def test_a_file_whose_meta_expired_is_none(remote: FileStore, client: redis.Redis, keys: Keys) -> None:
    meta = remote.put(b"expired", "e.txt", 60, "alpha")
    client.delete(keys.file(meta.id))
    assert remote.data(meta.id) is None and remote.meta(meta.id) is None


def test_a_failing_store_is_a_retryable_infrastructure_error(remote: FileStore, fake: FakeBlobs) -> None:
    meta = remote.put(b"kept", "k.txt", 60, "alpha")
    fake.fail = True
    for attempt in (lambda: remote.data(meta.id), lambda: remote.put(b"new", "n.txt", 60, "alpha")):
        with pytest.raises(InputStoreUnavailable, match="retry later") as caught:
            attempt()
        assert isinstance(caught.value, InfrastructureError)
        assert caught.value.retryable and caught.value.http_status == 503


def test_a_file_in_a_store_this_process_does_not_use_says_so(
    remote: FileStore, client: redis.Redis, keys: Keys
) -> None:
    meta = remote.put(b"in s3", "s.txt", 60, "alpha")
    local_only = FileStore(client, keys)
    with pytest.raises(InputStoreUnavailable, match="s3 store, which this process is not set to use"):
        local_only.data(meta.id)


def test_a_new_file_id_is_unguessable_and_of_the_documented_shape() -> None:
    ids = {new_file_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 31 and i.startswith("file_") and i[5:].isalnum() and i.islower() for i in ids)


def ref_of(data: bytes, size: int | None = None) -> InputFileRef:
    return InputFileRef(
        path="in/x.bin", file_id="file_" + "a" * 26, size=len(data) if size is None else size,
        sha256=hashlib.sha256(data).hexdigest(),
    )  # fmt: skip


@pytest.mark.parametrize("chunk", [1, 3, 64, 10_000])
def test_the_verified_reader_feeds_a_tar_exactly(chunk: int) -> None:
    data = bytes(range(256)) * 40
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        reader = VerifiedInput(ref_of(data), iter([data[i : i + chunk] for i in range(0, len(data), chunk)]))
        info = tarfile.TarInfo("x.bin")
        info.size = len(data)
        tar.addfile(info, reader)
        reader.finish()
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        member = tar.extractfile("x.bin")
        assert member is not None and member.read() == data


def test_the_verified_reader_checks_an_empty_file_on_finish() -> None:
    VerifiedInput(ref_of(b""), iter([b""])).finish()
    with pytest.raises(InputUnavailable, match="more than the 0 bytes"):
        VerifiedInput(ref_of(b""), iter([b"", b"x"])).finish()


def test_the_verified_reader_stops_at_the_first_byte_too_many() -> None:
    data = b"abcdef"
    reader = VerifiedInput(ref_of(data), iter([data, b"g", b"never pulled"]))
    with pytest.raises(InputUnavailable, match="more than the 6 bytes"):
        reader.read(6)


# -- the sweep: an object goes once its meta has gone ----------------------------------------------


def test_the_sweep_removes_only_data_whose_meta_is_gone_and_old_enough(
    remote: FileStore, fake: FakeBlobs, client: redis.Redis, keys: Keys
) -> None:
    assert isinstance(fake, SweptBlobs)
    live, expired, young = (remote.put(b"x", n, 60, "alpha") for n in ("live", "expired", "young"))
    client.delete(keys.file(expired.id))
    client.delete(keys.file(young.id))
    fake.stored_at[young.id] = 1000.0  # stored just now: its meta may be being written
    assert remote.sweep(now=1000.0, grace_s=600.0) == 1
    assert set(fake.objects) == {live.id, young.id}
    assert remote.sweep(now=2000.0, grace_s=600.0) == 1
    assert set(fake.objects) == {live.id}


def test_the_reaper_sweeps_input_objects_and_goes_on_when_the_store_fails(
    settings: Settings, client: redis.Redis, keys: Keys, fake: FakeBlobs, tmp_path: Path
) -> None:
    ctx = dataclasses.replace(context(settings, client, FakeEngine(), tmp_path), files=FileStore(client, keys, fake))
    live, orphan = ctx.files.put(b"live", "l", 60, "alpha"), ctx.files.put(b"orphan", "o", 60, "alpha")
    client.delete(keys.file(orphan.id))  # stored long ago (the fake's clock), its meta expired
    assert reaper.sweep(ctx)["input_files"] == 1
    assert set(fake.objects) == {live.id}
    fake.fail = True  # the object store is down: the rest of the sweep still runs and reports
    counts = reaper.sweep(ctx)
    assert counts["input_files"] == 0 and "containers" in counts


def test_data_in_the_redis_hash_has_nothing_to_sweep(client: redis.Redis, keys: Keys) -> None:
    files = FileStore(client, keys)
    files.put(b"x", "x", 60, "alpha")
    assert not isinstance(files.blobs, SweptBlobs) and isinstance(files.blobs, RedisHashBlobs)
    assert files.sweep() == 0


# -- the S3 side, against botocore's Stubber ------------------------------------------------------

FILE = "file_" + "b" * 26


@pytest.fixture
def stubbed() -> Iterator[tuple[S3InputBlobs, Stubber]]:
    store = S3ArtifactStore(endpoint="http://127.0.0.1:9", bucket="bkt", prefix="p", access_key="k", secret_key="s")
    with Stubber(store.client()) as stubber:
        yield S3InputBlobs(store, "dep/1"), stubber
        stubber.assert_no_pending_responses()


def test_s3_input_objects_sit_apart_from_artifacts_under_their_deployment(
    stubbed: tuple[S3InputBlobs, Stubber],
) -> None:
    blobs, stubber = stubbed
    assert blobs.key(FILE) == f"p/input-files/dep%2F1/{FILE}"
    sha256 = hashlib.sha256(b"hello").hexdigest()
    stubber.add_response("put_object", {}, {"Bucket": "bkt", "Key": blobs.key(FILE), "Body": ANY,
                                            "Metadata": {"sha256": sha256}})  # fmt: skip
    assert blobs.put(FILE, io.BytesIO(b"hello"), 10, 60) == (5, sha256)


@pytest.mark.parametrize("bad", ["file_../x", "../" + FILE, FILE + "/x", "exe_" + "a" * 26, "", "file_ABC"])
def test_s3_refuses_an_id_that_is_not_a_file_id_before_any_request(
    stubbed: tuple[S3InputBlobs, Stubber], bad: str
) -> None:
    blobs, _ = stubbed
    with pytest.raises(ValueError, match="bad file id"):
        blobs.put(bad, io.BytesIO(b"x"), 10, 60)
    with pytest.raises(ValueError, match="bad file id"):
        blobs.read(bad)


def test_s3_sweep_asks_redis_per_page_and_deletes_the_orphans(stubbed: tuple[S3InputBlobs, Stubber]) -> None:
    blobs, stubber = stubbed
    at = {10.0: datetime.fromtimestamp(10, UTC), 30.0: datetime.fromtimestamp(30, UTC)}
    names = ["file_" + c * 26 for c in "cdef"]
    listing = [(names[0], 10.0), (names[1], 10.0), (names[2], 30.0), (names[3], 10.0)]
    contents = [{"Key": blobs.prefix + n, "LastModified": at[t], "Size": 1} for n, t in listing]
    contents.append({"Key": blobs.prefix + "not-a-file-id", "LastModified": at[10.0], "Size": 1})
    stubber.add_response("list_objects_v2", {"Contents": contents, "IsTruncated": False},
                         {"Bucket": "bkt", "Prefix": blobs.prefix})  # fmt: skip
    stubber.add_response("delete_objects", {}, {"Bucket": "bkt", "Delete": {
        "Objects": [{"Key": blobs.prefix + names[1]}], "Quiet": True}})  # fmt: skip
    asked: list[list[str]] = []

    def alive(ids: list[str]) -> list[bool]:
        asked.append(ids)
        return [i != names[1] for i in ids]

    assert blobs.sweep(20.0, alive) == 1
    # Only old objects were asked about (the young one may be waiting for its meta); a key that is not
    # a file id is none of this sweep's business.
    assert asked == [[names[0], names[1], names[3]]]


def test_the_artifact_sweep_passes_over_input_files(stubbed: tuple[S3InputBlobs, Stubber]) -> None:
    blobs, stubber = stubbed
    old = datetime.fromtimestamp(10, UTC)
    contents = [{"Key": f"p/input-files/dep%2F1/{FILE}", "LastModified": old, "Size": 1}]
    stubber.add_response("list_objects_v2", {"Contents": contents, "IsTruncated": False},
                         {"Bucket": "bkt", "Prefix": "p/"})  # fmt: skip
    stubber.add_response("list_multipart_uploads", {}, {"Bucket": "bkt", "Prefix": "p/"})
    assert blobs.store.delete_older_than(20.0) == 0  # no delete_objects: the stub would fail on one


def test_input_blobs_follow_the_artifact_store(tmp_path: Path) -> None:
    assert input_blobs(LocalArtifactStore(tmp_path), "execbox") is None
    section = ArtifactSettings(store="s3", endpoint="http://x:1", bucket="b", access_key="k", secret_key="s")
    store = open_store(section, tmp_path)
    blobs = input_blobs(store, "execbox")
    assert isinstance(blobs, S3InputBlobs) and blobs.store is store  # one client for both
    assert blobs.prefix == "artifacts/input-files/execbox/"
