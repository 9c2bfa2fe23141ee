"""One contract for both artifact stores: the local directory and S3 on a real SeaweedFS cluster
(scripts/seaweedfs: a master, two volume servers with replication 001, a filer, the S3 gateway)."""

from __future__ import annotations

import hashlib
import io
import math
import os
import random
import signal
import subprocess
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from execbox.files.blobs import ArtifactStore, ArtifactTooLarge, LocalArtifactStore
from execbox.files.s3 import S3ArtifactStore
from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.slow]

SCRIPT = str(ROOT / "scripts" / "seaweedfs")
BUCKET = "execbox-test"
MiB = 1 << 20


@dataclass
class Cluster:
    root: Path
    env: dict[str, str]
    """What the script wrote to seaweedfs.env: endpoint and credentials."""

    def store(self, prefix: str) -> S3ArtifactStore:
        return S3ArtifactStore(
            endpoint=self.env["SEAWEEDFS_S3_ENDPOINT"],
            bucket=BUCKET,
            prefix=prefix,
            access_key=self.env["SEAWEEDFS_ACCESS_KEY"],
            secret_key=self.env["SEAWEEDFS_SECRET_KEY"],
            region=self.env["SEAWEEDFS_REGION"],
        )

    def client(self) -> Any:
        """A client of the test's own, to look at what a store left in the bucket."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.env["SEAWEEDFS_S3_ENDPOINT"],
            aws_access_key_id=self.env["SEAWEEDFS_ACCESS_KEY"],
            aws_secret_access_key=self.env["SEAWEEDFS_SECRET_KEY"],
            region_name=self.env["SEAWEEDFS_REGION"],
            config=Config(s3={"addressing_style": "path"}),
        )

    def pid(self, part: str) -> int:
        return int((self.root / f"{part}.pid").read_text())


def start_cluster(root: Path) -> Cluster:
    started = time.monotonic()
    done = subprocess.run([SCRIPT], env={**os.environ, "SEAWEEDFS_ROOT": str(root)}, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, f"scripts/seaweedfs failed:\n{done.stdout}\n{done.stderr}"
    print(f"SeaweedFS cluster up in {time.monotonic() - started:.1f} s: {done.stdout.strip()}")  # noqa: T201
    lines = (root / "seaweedfs.env").read_text().splitlines()
    cluster = Cluster(root, dict(line.split("=", 1) for line in lines if "=" in line))
    cluster.store("").ensure_bucket()
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    done = subprocess.run([SCRIPT, "--kill"], env={**os.environ, "SEAWEEDFS_ROOT": str(cluster.root)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"scripts/seaweedfs --kill failed:\n{done.stdout}\n{done.stderr}"
    assert not cluster.root.exists()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    """Each store empty for its test: a fresh directory, or a fresh key prefix in the shared bucket."""
    if request.param == "local":
        return LocalArtifactStore(tmp_path / "artifacts")
    cluster: Cluster = request.getfixturevalue("seaweedfs")
    return cluster.store(f"t-{uuid.uuid4().hex}/")


def execution_id() -> str:
    return "exe_" + uuid.uuid4().hex[:26]


class Generated(io.RawIOBase):
    """`size` pseudo-random bytes (from `seed`) made as they are read, so the test holds none of them."""

    def __init__(self, size: int, seed: bytes = b"") -> None:
        self.left = size
        self.random = random.Random(seed)
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left, 1 << 16)
        block = self.random.randbytes(n)
        buffer[:n] = block
        self.sha256.update(block)
        self.left -= n
        return n


def read_all(store: ArtifactStore, eid: str, name: str) -> bytes:
    return b"".join(store.read(eid, name))


def test_round_trip_keeps_bytes_and_checksum(store: ArtifactStore) -> None:
    eid = execution_id()
    for name, data in [("report.md", b"# report\n"), ("empty", b""), ("data/out.bin", os.urandom(300_000))]:
        size, sha256 = store.put(eid, name, io.BytesIO(data), limit=1 * MiB)
        assert (size, sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert read_all(store, eid, name) == data
        assert store.size(eid, name) == len(data)


def test_50_mib_artifact_streams_through_with_bounded_memory(store: ArtifactStore) -> None:
    eid, size = execution_id(), 50 * MiB
    source = Generated(size, seed=b"big")
    # A first put and read before measuring: botocore loads its S3 model on first use (megabytes, once).
    store.put(eid, "warm-up", io.BytesIO(b"x"), limit=1)
    assert read_all(store, eid, "warm-up") == b"x"
    tracemalloc.start()
    try:
        stored = store.put(eid, "big.bin", io.BufferedReader(source), limit=64 * MiB)
        _, put_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        digest, total = hashlib.sha256(), 0
        for chunk in store.read(eid, "big.bin"):
            digest.update(chunk)
            total += len(chunk)
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    peaks = f"put with a peak of {put_peak / MiB:.1f} MiB, read with {read_peak / MiB:.1f} MiB"
    print(f"{type(store).__name__}: 50 MiB {peaks}")  # noqa: T201
    assert stored == (size, source.sha256.hexdigest())
    assert (total, digest.hexdigest()) == stored
    # At most one part in memory (8 MiB for S3), never the artifact; a read holds a chunk or two.
    assert put_peak < 12 * MiB, put_peak
    assert read_peak < 2 * MiB, read_peak


@pytest.mark.parametrize("size", [3 * MiB, 20 * MiB], ids=["one-part", "multipart"])
def test_over_limit_raises_and_leaves_no_object(
    store: ArtifactStore, size: int, request: pytest.FixtureRequest
) -> None:
    eid = execution_id()
    store.put(eid, "kept.txt", io.BytesIO(b"kept"), limit=100)
    with pytest.raises(ArtifactTooLarge):
        store.put(eid, "huge.bin", io.BufferedReader(Generated(size)), limit=size - 1)
    with pytest.raises(FileNotFoundError):
        store.size(eid, "huge.bin")
    assert read_all(store, eid, "kept.txt") == b"kept"
    if isinstance(store, S3ArtifactStore):  # the parts already sent went with the aborted upload
        client = request.getfixturevalue("seaweedfs").client()
        assert client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads", []) == []
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix).get("Contents", [])]
        assert keys == [f"{store.prefix}{eid}/{hashlib.sha256(b'kept.txt').hexdigest()}"]
    elif isinstance(store, LocalArtifactStore):
        assert sorted(p.name for p in Path(store.root, eid).iterdir()) == [hashlib.sha256(b"kept.txt").hexdigest()]


def test_absent_artifact_is_file_not_found(store: ArtifactStore) -> None:
    eid = execution_id()
    for where in (eid, execution_id()):  # an execution with other artifacts, and one with none
        store.put(eid, "present", io.BytesIO(b"x"), limit=10)
        with pytest.raises(FileNotFoundError):
            store.size(where, "absent")
        with pytest.raises(FileNotFoundError):
            read_all(store, where, "absent")


def test_two_executions_do_not_see_each_other(store: ArtifactStore) -> None:
    alpha, beta = execution_id(), execution_id()
    store.put(alpha, "result.json", io.BytesIO(b'{"who": "alpha"}'), limit=100)
    store.put(beta, "result.json", io.BytesIO(b'{"who": "beta"}'), limit=100)
    store.put(alpha, "only-alpha.txt", io.BytesIO(b"secret"), limit=100)
    assert read_all(store, alpha, "result.json") == b'{"who": "alpha"}'
    assert read_all(store, beta, "result.json") == b'{"who": "beta"}'
    with pytest.raises(FileNotFoundError):
        store.size(beta, "only-alpha.txt")
    # An id that would climb out of its own place is refused before anything is read.
    for bad in ("../" + alpha, f"{alpha}/..", "a/b", "", ".."):
        with pytest.raises(ValueError):
            store.size(bad, "result.json")


def test_delete_older_than_removes_only_old_executions(store: ArtifactStore) -> None:
    old, new = execution_id(), execution_id()
    store.put(old, "a", io.BytesIO(b"old a"), limit=100)
    store.put(old, "b", io.BytesIO(b"old b"), limit=100)
    # S3 keeps LastModified in whole seconds: the cutoff is the next whole second, and the new
    # execution is stored once the clock has passed it.
    cutoff = math.floor(time.time()) + 1.0
    wait_until(lambda: time.time() > cutoff, 3, "the clock to pass the cutoff", step_s=0.05)
    store.put(new, "a", io.BytesIO(b"new a"), limit=100)
    assert store.delete_older_than(cutoff) == 1
    for name in ("a", "b"):
        with pytest.raises(FileNotFoundError):
            store.size(old, name)
    assert read_all(store, new, "a") == b"new a"
    assert store.delete_older_than(cutoff) == 0


# S3 only: what the object store adds to the contract.


@pytest.mark.parametrize("size", [1000, 12 * MiB], ids=["one-part", "multipart"])
def test_s3_keeps_the_checksum_with_the_object(seaweedfs: Cluster, size: int) -> None:
    store, eid = seaweedfs.store(f"t-{uuid.uuid4().hex}"), execution_id()
    source = Generated(size, seed=b"sum")
    _, sha256 = store.put(eid, "file", io.BufferedReader(source), limit=size)
    assert sha256 == source.sha256.hexdigest()
    assert store.sha256(eid, "file") == sha256
    head = seaweedfs.client().head_object(
        Bucket=BUCKET, Key=f"{store.prefix}{eid}/{hashlib.sha256(b'file').hexdigest()}"
    )
    assert head["Metadata"] == {"sha256": sha256}


def test_s3_retention_also_aborts_uploads_left_open(seaweedfs: Cluster) -> None:
    """A worker that died mid-upload leaves a multipart upload open (parts stored, no object):
    retention aborts it once it is older than the cutoff, and leaves a younger one."""
    store, client = seaweedfs.store(f"t-{uuid.uuid4().hex}"), seaweedfs.client()
    key = f"{store.prefix}{execution_id()}/{hashlib.sha256(b'half').hexdigest()}"
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1000)

    def open_uploads() -> list[str]:
        return [
            u["UploadId"] for u in client.list_multipart_uploads(Bucket=BUCKET, Prefix=store.prefix).get("Uploads", [])
        ]

    assert store.delete_older_than(time.time() - 3600) == 0
    assert open_uploads() == [upload]
    assert store.delete_older_than(time.time() + 60) == 0  # no finished objects: no execution counted
    assert open_uploads() == []


def test_starting_the_script_again_finds_the_running_cluster(seaweedfs: Cluster) -> None:
    pids = {part: seaweedfs.pid(part) for part in ("master", "volume-1", "volume-2", "filer", "s3")}
    done = subprocess.run([SCRIPT], env={**os.environ, "SEAWEEDFS_ROOT": str(seaweedfs.root)}, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert seaweedfs.env["SEAWEEDFS_S3_ENDPOINT"] in done.stdout
    assert {part: seaweedfs.pid(part) for part in pids} == pids


def test_losing_one_volume_server_keeps_every_artifact_readable(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Replication 001 puts every chunk on both volume servers: with one killed, all still read back.
    A cluster of its own, since the session's must keep accepting writes (which need both)."""
    cluster = start_cluster(tmp_path_factory.mktemp("seaweedfs-loss") / "cluster")
    try:
        store = cluster.store("loss")
        stored: dict[tuple[str, str], str] = {}
        for i, size in enumerate([0, 1, 5000, 300_000, 2 * MiB, 9 * MiB, 17 * MiB]):
            eid = execution_id()
            for name in (f"a{i}", f"b{i}"):
                _, stored[eid, name] = store.put(
                    eid, name, io.BufferedReader(Generated(size, name.encode())), limit=size
                )
        victim = cluster.pid("volume-2")
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: not _alive(victim), 10, "the killed volume server to be gone")
        started = time.monotonic()
        for (eid, name), sha256 in stored.items():
            digest = hashlib.sha256()
            for chunk in store.read(eid, name):
                digest.update(chunk)
            assert digest.hexdigest() == sha256, (eid, name)
        took = time.monotonic() - started
        print(f"{len(stored)} artifacts read back with one of two volume servers dead in {took:.1f} s")  # noqa: T201
    finally:
        stop_cluster(cluster)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited: the script's shell, its parent, is gone, so init reaps it soon.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
