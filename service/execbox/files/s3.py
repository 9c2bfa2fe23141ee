"""Artifacts in an S3-compatible object store (SeaweedFS, MinIO, AWS S3): the ArtifactStore seam's second side.

An artifact is one object, `<prefix><execution id>/<sha256 of its name>`, so as on disk no name a
program chose becomes part of a key, and one execution's artifacts share a prefix that no other
execution's ids can reach. Uploads stream: one PUT for what fits in a part, a multipart upload
otherwise, so at most one part is in memory; the object appears only when complete. The sha256 is
computed on the way and kept in the object's metadata (`x-amz-meta-sha256`). botocore's errors stay
here: absent becomes FileNotFoundError, anything else S3StoreError (an OSError, as a disk's failure
would be).

Input files (uploads and inline files of executions) use the same bucket, client and streaming put
through S3InputBlobs: one object per file, `<prefix>input-files/<deployment>/<file id>`. Their life
is their meta's in Redis, which executions extend, so they are not swept by age but when that meta
is gone (`S3InputBlobs.sweep`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import IO, Any
from urllib.parse import quote

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from execbox.files.blobs import ArtifactTooLarge

_CHUNK = 1 << 16
# S3's smallest part but the last is 5 MiB; 8 MiB halves the requests for what that costs in memory.
DEFAULT_PART_SIZE = 8 << 20
_ABSENT = {"404", "NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload"}
_DELETE_BATCH = 1000  # DeleteObjects' limit per request
INPUTS_SEGMENT = "input-files"
"""Input files live under `<prefix>input-files/`: a segment no execution id can be ('-' is not in one),
so the artifacts' sweep passes over them."""
_FILE_ID = re.compile(r"^file_[a-z0-9]{26}$")


class S3StoreError(OSError):
    """The object store failed or refused a request (not an absent object)."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(f"artifact store: {operation} failed: {detail}; check the S3 endpoint, bucket and credentials")


def _object_name(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()


def _check_id(execution_id: str) -> str:
    # The same rule as LocalArtifactStore: an id is a path segment there and a key segment here.
    if not execution_id.isalnum() and not execution_id.replace("_", "").isalnum():
        raise ValueError(f"bad execution id {execution_id!r}")
    return execution_id


class S3ArtifactStore:
    def __init__(
        self,
        *,
        endpoint: str | None,
        bucket: str,
        prefix: str = "artifacts/",
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        part_size: int = DEFAULT_PART_SIZE,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        max_attempts: int = 4,
        sweep_interval_s: float = 0.0,
    ) -> None:
        """Nothing is created or contacted here; `ensure_bucket()` makes the bucket when asked.

        endpoint None means AWS itself; credentials None means botocore's usual chain (environment,
        files, instance role). The prefix lets one bucket hold several deployments. A retention
        sweep lists every key, so `delete_older_than` does nothing within `sweep_interval_s` of
        this process's previous sweep (the reaper asks at each of its passes).
        """
        if part_size < 5 << 20:
            raise ValueError("part_size must be at least 5 MiB (S3's smallest part but the last)")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.part_size = part_size
        self._session_args = {
            "aws_access_key_id": access_key,
            "aws_secret_access_key": secret_key,
            "region_name": region,
        }
        self._endpoint = endpoint
        # Path-style addressing: SeaweedFS and MinIO on a bare host name have no per-bucket DNS.
        # Bounded waits and a few retries of S3's transient errors (throttling, 5xx, resets).
        self._config = Config(
            s3={"addressing_style": "path"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
        )
        self._lock = threading.Lock()
        self._client_pid = -1
        self._client_obj: Any = None
        self.sweep_interval_s = sweep_interval_s
        self._last_sweep = -math.inf

    def client(self) -> Any:
        """This process's boto3 S3 client (for the store's own calls, tools and tests' stubs)."""
        # One client per process, made on first use: a client is thread-safe but its connection
        # pool must not be shared with a process RQ forked (a work horse) after it was made.
        with self._lock:
            if self._client_pid != os.getpid():
                session = boto3.session.Session(**self._session_args)
                self._client_obj = session.client("s3", endpoint_url=self._endpoint, config=self._config)
                self._client_pid = os.getpid()
            return self._client_obj

    def _key(self, execution_id: str, name: str) -> str:
        return f"{self.prefix}{_check_id(execution_id)}/{_object_name(name)}"

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (tests, a first start; in production the operator makes it)."""
        client = self.client()
        try:
            with _mapped("head_bucket"):
                client.head_bucket(Bucket=self.bucket)
            return
        except FileNotFoundError:
            pass
        try:
            with _mapped("create_bucket", writing=True):
                client.create_bucket(Bucket=self.bucket)
        except S3StoreError as error:
            # Made meanwhile by another process starting at the same time: what was asked for.
            cause = error.__cause__
            if not (
                isinstance(cause, ClientError) and _code(cause) in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}
            ):
                raise

    def put(self, execution_id: str, name: str, data: IO[bytes], limit: int) -> tuple[int, str]:
        return self.put_object(self._key(execution_id, name), data, limit, name)

    def put_object(self, key: str, data: IO[bytes], limit: int, label: str) -> tuple[int, str]:
        """Store at most `limit` bytes under `key`; (size, sha256 hex), the checksum also kept as the
        object's metadata. ArtifactTooLarge(label) past the limit, with nothing left behind."""
        digest = hashlib.sha256()
        size = 0

        def next_part() -> tuple[io.BytesIO, int]:
            # One part's bytes, counted and hashed as they arrive; past `limit` nothing more is sent.
            # A seekable body: botocore reads it for its checksums and sends it without a copy.
            nonlocal size
            part = io.BytesIO()
            while part.tell() < self.part_size and (chunk := data.read(min(_CHUNK, self.part_size - part.tell()))):
                size += len(chunk)
                if size > limit:
                    raise ArtifactTooLarge(label)
                digest.update(chunk)
                part.write(chunk)
            length = part.tell()
            part.seek(0)
            return part, length

        client = self.client()
        part, length = next_part()
        if length < self.part_size:  # all of it fits in one part: a single PUT
            metadata = {"sha256": digest.hexdigest()}
            with _mapped("put_object", writing=True):
                client.put_object(Bucket=self.bucket, Key=key, Body=part, Metadata=metadata)
            return size, metadata["sha256"]
        with _mapped("create_multipart_upload", writing=True):
            upload_id = client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = []
            number = 1
            while length:
                with _mapped("upload_part", writing=True):
                    etag = client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part
                    )["ETag"]
                parts.append({"PartNumber": number, "ETag": etag})
                del part  # the next part's bytes replace this one's, not join them
                part, length = next_part()
                number += 1
            with _mapped("complete_multipart_upload", writing=True):
                client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            # Too large, a failed read or a refused part: the parts already sent are dropped, so
            # nothing of this artifact stays (and no storage is billed for an upload left open).
            try:
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except (ClientError, BotoCoreError):
                pass  # delete_older_than aborts uploads left open
            raise
        # The checksum is known only now: it is set on the finished object by a copy onto itself
        # that replaces its metadata (server-side; SeaweedFS only rewrites the entry).
        sha256 = digest.hexdigest()
        with _mapped("copy_object", writing=True):
            client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
                Metadata={"sha256": sha256},
            )
        return size, sha256

    def read(self, execution_id: str, name: str) -> Iterator[bytes]:
        return self.read_object(self._key(execution_id, name))

    def read_object(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks (asked for at the first one); FileNotFoundError when absent."""
        with _mapped("get_object"):
            body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            with _mapped("get_object (body)"):
                yield from body.iter_chunks(_CHUNK)
        finally:
            body.close()

    def size(self, execution_id: str, name: str) -> int:
        with _mapped("head_object"):
            return int(
                self.client().head_object(Bucket=self.bucket, Key=self._key(execution_id, name))["ContentLength"]
            )

    def sha256(self, execution_id: str, name: str) -> str | None:
        """The checksum kept with the object when it was stored (None for an object stored without one)."""
        with _mapped("head_object"):
            head = self.client().head_object(Bucket=self.bucket, Key=self._key(execution_id, name))
        value = head.get("Metadata", {}).get("sha256")
        return str(value) if value else None

    def delete_older_than(self, cutoff: float) -> int:
        """Remove each execution whose newest artifact was stored before `cutoff`, as the local
        store removes a directory not modified since; also abort uploads left open since then."""
        now = time.monotonic()
        if now - self._last_sweep < self.sweep_interval_s:
            return 0
        # Counted from the start, failed or not: a store that is down is not asked again at once.
        self._last_sweep = now
        client = self.client()
        removed = 0
        # Keys are listed in order, so one execution's objects come together: only one execution's
        # keys are held at a time, however many the bucket has.
        current: str | None = None
        keys: list[str] = []
        newest = 0.0
        for obj in self._list(client, "list_objects_v2", "Contents"):
            execution_id = obj["Key"][len(self.prefix) :].split("/", 1)[0]
            if execution_id == INPUTS_SEGMENT:  # input files: the input sweep's, by their meta in Redis
                continue
            if execution_id != current:
                removed += self._drop_if_old(client, keys, newest, cutoff)
                current, keys, newest = execution_id, [], 0.0
            keys.append(obj["Key"])
            newest = max(newest, _timestamp(obj["LastModified"]))
        removed += self._drop_if_old(client, keys, newest, cutoff)
        for upload in self._list(client, "list_multipart_uploads", "Uploads"):
            if _timestamp(upload["Initiated"]) < cutoff:
                with _mapped("abort_multipart_upload", absent_ok=True):
                    client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        return removed

    def _list(self, client: Any, operation: str, field: str) -> Iterator[dict[str, Any]]:
        # No bucket yet holds nothing to list, as a missing directory does for the local store.
        with _mapped(operation, absent_ok=True):
            for page in client.get_paginator(operation).paginate(Bucket=self.bucket, Prefix=self.prefix):
                yield from page.get(field, [])

    def _drop_if_old(self, client: Any, keys: list[str], newest: float, cutoff: float) -> int:
        if not keys or newest >= cutoff:
            return 0
        self.delete_keys(keys, client)
        return 1

    def delete_keys(self, keys: list[str], client: Any = None) -> None:
        """Remove these objects (an absent one is not an error), a thousand per request."""
        client = client or self.client()
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
            with _mapped("delete_objects", writing=True):
                answer = client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise S3StoreError("delete_objects", f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _failed(operation: str, error: Exception) -> S3StoreError:
    if isinstance(error, ClientError):
        return S3StoreError(operation, f"{_code(error)} {error.response.get('Error', {}).get('Message', '')}".strip())
    return S3StoreError(operation, str(error))


@contextmanager
def _mapped(operation: str, *, writing: bool = False, absent_ok: bool = False) -> Iterator[None]:
    """Translate botocore's errors at this seam: an absent object is FileNotFoundError (or nothing,
    when absent_ok), the rest S3StoreError. Writing, nothing is expected to be absent but the
    bucket, and a missing bucket is the operator's to fix, not a missing artifact."""
    try:
        yield
    except ClientError as error:
        if _code(error) in _ABSENT and not writing:
            if absent_ok:
                return
            raise FileNotFoundError(f"artifact store: {operation}: no such object") from error
        raise _failed(operation, error) from error
    except BotoCoreError as error:
        raise _failed(operation, error) from error


def _timestamp(value: datetime) -> float:
    return value.timestamp()


class S3InputBlobs:
    """Input file data in the artifact store's bucket: execbox.files.store.InputBlobs on S3.

    `deployment` (the Redis key prefix) is part of every key: the sweep removes an object whose
    meta its own Redis no longer holds, so two deployments sharing a bucket and prefix by mistake
    still never sweep each other's files.
    """

    kind = "s3"

    def __init__(self, store: S3ArtifactStore, deployment: str) -> None:
        self.store = store
        self.prefix = f"{store.prefix}{INPUTS_SEGMENT}/{quote(deployment, safe='')}/"
        self._last_sweep = -math.inf

    def key(self, file_id: str) -> str:
        if not _FILE_ID.match(file_id):
            raise ValueError(f"bad file id {file_id!r}")
        return self.prefix + file_id

    def put(self, file_id: str, data: IO[bytes], limit: int, ttl_s: int) -> tuple[int, str]:
        # ttl_s is the meta's business: the object goes when its meta has gone (see sweep).
        return self.store.put_object(self.key(file_id), data, limit, file_id)

    def read(self, file_id: str) -> Iterator[bytes]:
        return self.store.read_object(self.key(file_id))

    def delete(self, file_id: str) -> None:
        self.store.delete_keys([self.key(file_id)])

    def sweep(self, stored_before: float, alive: Callable[[list[str]], list[bool]]) -> int:
        """Remove the objects stored before `stored_before` whose file `alive` says is gone; return
        how many. Paced like the artifacts' sweep (the store's sweep_interval_s), since it lists
        every input object; `alive` is asked once per page of up to a thousand ids."""
        now = time.monotonic()
        if now - self._last_sweep < self.store.sweep_interval_s:
            return 0
        self._last_sweep = now
        client = self.store.client()
        removed = 0
        with _mapped("list_objects_v2", absent_ok=True):
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.store.bucket, Prefix=self.prefix)
            for page in pages:
                old = {
                    obj["Key"][len(self.prefix) :]: obj["Key"]
                    for obj in page.get("Contents", [])
                    if _timestamp(obj["LastModified"]) < stored_before
                    and _FILE_ID.match(obj["Key"][len(self.prefix) :])
                }
                ids = sorted(old)
                gone = [old[i] for i, live in zip(ids, alive(ids) if ids else [], strict=True) if not live]
                if gone:
                    self.store.delete_keys(gone, client)
                    removed += len(gone)
        return removed
