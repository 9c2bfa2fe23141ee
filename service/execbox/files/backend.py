"""The artifact store a deployment's settings choose: the local directory or an S3 bucket; and where
input file data goes with it (the Redis hash beside the local directory, the same bucket with S3).

API and workers both build theirs here, so they always agree on where an artifact or a file is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from execbox.files.blobs import ArtifactStore, LocalArtifactStore
from execbox.files.s3 import S3ArtifactStore, S3InputBlobs
from execbox.files.settings import ArtifactBackend, ArtifactSettings
from execbox.files.store import InputBlobs

BUCKET_CHECK_S = 30.0
"""Longest the API's start waits for the bucket (found or made) before failing."""


class ArtifactStoreUnusable(RuntimeError):
    """The configured store cannot be used: the API does not start."""


def open_store(section: ArtifactSettings, local_dir: Path) -> ArtifactStore:
    """The store `section` names; nothing is contacted yet (see `prepare`)."""
    if section.store is ArtifactBackend.LOCAL:
        return LocalArtifactStore(local_dir)
    assert section.bucket is not None  # the section's validator requires it for s3
    return S3ArtifactStore(
        endpoint=section.endpoint,
        bucket=section.bucket,
        prefix=section.prefix,
        access_key=section.access_key,
        secret_key=section.secret(),
        region=section.region,
        sweep_interval_s=section.sweep_interval_s,
    )


def input_blobs(store: ArtifactStore, deployment: str) -> InputBlobs | None:
    """Where new input files' data goes beside `store`: the same bucket (and client) for S3, else
    None, which FileStore reads as its Redis hash. `deployment`: the Redis key prefix."""
    return S3InputBlobs(store, deployment) if isinstance(store, S3ArtifactStore) else None


async def prepare(store: ArtifactStore, timeout_s: float = BUCKET_CHECK_S) -> None:
    """At the API's start: an S3 store's bucket is found (or made) within `timeout_s`, or the API
    fails to start with the reason; a local directory needs nothing."""
    if not isinstance(store, S3ArtifactStore):
        return
    where = f"bucket {store.bucket!r} (EXECBOX_ARTIFACTS__ENDPOINT, __BUCKET, __ACCESS_KEY, __SECRET_KEY)"
    try:
        # botocore's own timeouts and retries bound each request; this bounds them all together.
        await asyncio.wait_for(asyncio.to_thread(store.ensure_bucket), timeout_s)
    except TimeoutError as error:
        raise ArtifactStoreUnusable(f"artifact store: no answer for {timeout_s:.0f} s about {where}") from error
    except OSError as error:
        raise ArtifactStoreUnusable(f"artifact store: {where} is not usable: {error}") from error


__all__ = ["ArtifactStoreUnusable", "input_blobs", "open_store", "prepare"]
