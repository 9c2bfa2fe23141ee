"""Input files in a deployment set to EXECBOX_ARTIFACTS__STORE=s3: uploads and inline files go to a real
SeaweedFS cluster (the session's, scripts/seaweedfs), their meta stays in the real Redis, and a
worker gives them to a real Docker sandbox byte for byte. Their tenant only; a lost object is a
clear error, not a crash; a hash stored before (data in Redis) still reads; the sweep removes an
object once its meta is gone."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import secrets
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from execbox.files.s3 import S3InputBlobs
from execbox.files.schemas import FilePublic
from execbox.files.store import FileStore, new_file_id
from execbox.keyschema import Keys
from tests.conftest import EXECBOX, Processes, Redis, Side, Stack, answers_200, auth, free_port, wait_until
from tests.integration.test_s3_artifacts import Cluster, Generated
from tests.integration.test_s3_service import s3_env

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.slow]

MiB = 1 << 20
# Prints each input's size and sha256 as the sandbox sees it.
DIGESTS = """
import hashlib, json, pathlib
paths = sorted(str(p) for p in pathlib.Path(".").rglob("*") if p.is_file() and p.name != "main.py"
               and not str(p).startswith((".execbox", "out")))
print(json.dumps({p: [pathlib.Path(p).stat().st_size, hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()]
                  for p in paths}))
"""


@dataclass
class Deployment:
    side: Side
    cluster: Cluster
    bucket: str
    prefix: str
    redis: redis.Redis
    keys: Keys

    def api(self) -> httpx.Client:
        return self.side.client()

    def object_key(self, file_id: str) -> str:
        return f"{self.prefix}/input-files/{self.keys.prefix}/{file_id}"

    def objects(self) -> list[str]:
        listed = self.cluster.client().list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/input-files/")
        return [o["Key"] for o in listed.get("Contents", [])]

    def local_dir_empty(self) -> bool:
        """Nothing on the disk the local store would use."""
        return not any(Path(self.side.env["EXECBOX_ARTIFACTS_DIR"]).iterdir())

    def hash_fields(self, file_id: str) -> dict[bytes, bytes]:
        return self.redis.hgetall(self.keys.file(file_id))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def deployment(
    seaweedfs: Cluster,
    stack: Stack,
    module_processes: Processes,
    redis_server: Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """An API and a worker with an S3 store of their own (a fresh bucket the API makes), on a queue of
    their own, for the module's tests."""
    directory = tmp_path_factory.mktemp("s3-inputs")
    (directory / "local").mkdir()
    bucket, prefix = f"execbox-in-{secrets.token_hex(4)}", "dep-in"
    queue = f"{stack.prefix}-{secrets.token_hex(3)}"
    env = {**stack.env, "EXECBOX_QUEUE__NAME": queue,
           **s3_env(seaweedfs, bucket, prefix, directory / "s3-secret", directory / "local")}  # fmt: skip
    port = free_port()
    module_processes.spawn(f"api-{queue}", [EXECBOX, "api", "--port", str(port)], env)
    base_url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers_200(f"{base_url}/healthz"), 30, "the S3 inputs API to answer")
    side = Side(env, base_url, module_processes, stack.keys["alpha"])
    side.worker("s3-inputs")
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield Deployment(side, seaweedfs, bucket, prefix, client, Keys(stack.prefix))
    finally:
        client.close()


def upload(api: httpx.Client, name: str, data: bytes) -> dict[str, Any]:
    response = api.post("/v1/files", files={"file": (name, data, "application/octet-stream")})
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def run(api: httpx.Client, files: list[dict[str, Any]], code: str = DIGESTS) -> dict[str, Any]:
    response = api.post("/v1/executions?wait=60", json={"language": "python", "code": code, "files": files})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def seen(data: bytes) -> list[Any]:
    return [len(data), hashlib.sha256(data).hexdigest()]


def test_an_upload_and_an_inline_file_reach_the_sandbox_byte_for_byte_from_the_bucket(
    deployment: Deployment,
) -> None:
    # 9 MiB: past one 8 MiB part, so the upload into the bucket is a multipart one.
    big = random.Random(7).randbytes(9 * MiB)
    inline = b"inline,bytes\n\x00\xff"
    with deployment.api() as api:
        uploaded = upload(api, "big.bin", big)
        assert uploaded["size"] == len(big) and uploaded["sha256"] == hashlib.sha256(big).hexdigest()
        body = run(api, [{"path": "data/big.bin", "file_id": uploaded["id"]},
                         {"path": "inline.txt", "content_b64": base64.b64encode(inline).decode()}])  # fmt: skip
    assert body["status"] == "succeeded", body
    assert json.loads(body["stdout"]) == {"data/big.bin": seen(big), "inline.txt": seen(inline)}

    # Both files: in Redis the meta and where the data is, in the bucket the data with its checksum.
    inline_ids = [
        meta.id for key in deployment.redis.scan_iter(match=deployment.keys.file("*"))
        if (meta := FilePublic.model_validate_json(deployment.redis.hget(key, "meta") or b"{}")).name == "inline.txt"
        and meta.sha256 == hashlib.sha256(inline).hexdigest()
    ]  # fmt: skip
    assert len(inline_ids) == 1, inline_ids
    s3 = deployment.cluster.client()
    for file_id in (uploaded["id"], *inline_ids):
        fields = deployment.hash_fields(file_id)
        assert fields[b"blob"] == b"s3" and b"data" not in fields, fields.keys()
        meta = FilePublic.model_validate_json(fields[b"meta"])
        head = s3.head_object(Bucket=deployment.bucket, Key=deployment.object_key(file_id))
        assert head["ContentLength"] == meta.size and head["Metadata"]["sha256"] == meta.sha256
    assert deployment.local_dir_empty()


def test_another_tenant_gets_no_such_file(deployment: Deployment, stack: Stack) -> None:
    with deployment.api() as api:
        uploaded = upload(api, "mine.txt", b"alpha's only")
    with httpx.Client(base_url=deployment.side.base_url, headers=auth(stack.keys["beta"]), timeout=60) as beta:
        assert beta.get(f"/v1/files/{uploaded['id']}").status_code == 404
        refused = beta.post("/v1/executions", json={"language": "python", "code": "print(1)",
                                                    "files": [{"path": "x", "file_id": uploaded["id"]}]})  # fmt: skip
        assert refused.status_code == 422, refused.text
        assert "files.0.file_id" in refused.text


def test_an_object_removed_behind_the_api_ends_the_execution_with_a_clear_error(deployment: Deployment) -> None:
    with deployment.api() as api:
        lost = upload(api, "lost.csv", b"a,b\n")
        deployment.cluster.client().delete_object(Bucket=deployment.bucket, Key=deployment.object_key(lost["id"]))
        body = run(api, [{"path": "lost.csv", "file_id": lost["id"]}])
        assert body["status"] == "failed", body
        error = body["error"]
        assert error["category"] == "sandbox.error" and error["details"]["code"] == "sandbox.input_unavailable"
        assert lost["id"] in error["message"] and "no longer stored" in error["message"]
        assert "upload it again" in error["message"]
        # The worker goes on: a file uploaded again runs.
        again = upload(api, "lost.csv", b"a,b\n")
        assert run(api, [{"path": "lost.csv", "file_id": again["id"]}])["status"] == "succeeded"


def test_a_file_stored_by_an_older_version_with_its_data_in_redis_still_runs(
    deployment: Deployment, stack: Stack
) -> None:
    data = b"written before input files could live in S3\n"
    now = time.time()
    meta = FilePublic(id=new_file_id(), name="old.txt", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                      created_at=now, expires_at=now + 600, tenant="alpha")  # fmt: skip
    key = deployment.keys.file(meta.id)
    deployment.redis.hset(key, mapping={"meta": meta.model_dump_json(), "data": data})  # the old layout, no `blob`
    deployment.redis.expire(key, 600)
    with deployment.api() as api:
        body = run(api, [{"path": "old.txt", "file_id": meta.id}])
    assert body["status"] == "succeeded", body
    assert json.loads(body["stdout"]) == {"old.txt": seen(data)}
    assert deployment.object_key(meta.id) not in deployment.objects()


# In-process, against the same SeaweedFS and Redis: what needs no sandbox.


@pytest.fixture
def files(seaweedfs: Cluster, redis_server: Redis) -> Iterator[tuple[FileStore, S3InputBlobs, redis.Redis]]:
    """A FileStore over a fresh key prefix and a fresh S3 prefix of the session's bucket."""
    client = redis.Redis.from_url(redis_server.url)
    keys = Keys(f"inputs{secrets.token_hex(3)}")
    blobs = S3InputBlobs(seaweedfs.store(f"t-{secrets.token_hex(6)}"), keys.prefix)
    try:
        yield FileStore(client, keys, blobs), blobs, client
    finally:
        for key in client.scan_iter(match=f"{keys.prefix}:*"):
            client.delete(key)
        client.close()


def test_a_large_upload_streams_into_the_bucket_with_bounded_memory(
    files: tuple[FileStore, S3InputBlobs, redis.Redis],
) -> None:
    store, _, _ = files
    store.put(b"warm-up", "w", 60, "alpha")  # botocore loads its S3 model on first use (megabytes, once)
    source = Generated(30 * MiB, seed=b"inputs")
    tracemalloc.start()
    try:
        meta = store.put(io.BufferedReader(source), "big.bin", 60, "alpha", limit=30 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"a 30 MiB input file stored with a peak of {peak / MiB:.1f} MiB")  # noqa: T201
    assert (meta.size, meta.sha256) == (30 * MiB, source.sha256.hexdigest())
    assert peak < 12 * MiB, peak  # one 8 MiB part at most, never the file
    assert hashlib.sha256(store.data(meta.id) or b"").hexdigest() == meta.sha256


def test_the_sweep_removes_an_object_once_its_meta_is_gone(
    files: tuple[FileStore, S3InputBlobs, redis.Redis], seaweedfs: Cluster
) -> None:
    store, blobs, client = files
    kept, expired = store.put(b"kept", "k", 60, "alpha"), store.put(b"expired", "e", 60, "alpha")
    client.delete(store.keys.file(expired.id))  # its TTL ran out
    listed: Callable[[], list[str]] = lambda: [  # noqa: E731
        o["Key"] for o in seaweedfs.client().list_objects_v2(Bucket="execbox-test", Prefix=blobs.prefix).get(
            "Contents", [])]  # fmt: skip
    assert sorted(listed()) == sorted([blobs.key(kept.id), blobs.key(expired.id)])
    # Within the grace, nothing goes: an object may be waiting for its meta to be written.
    assert store.sweep(grace_s=3600) == 0
    # S3 keeps LastModified in whole seconds: a cutoff a second ahead covers both objects.
    assert store.sweep(now=time.time() + 2, grace_s=0) == 1
    assert listed() == [blobs.key(kept.id)]
    assert store.data(kept.id) == b"kept"
