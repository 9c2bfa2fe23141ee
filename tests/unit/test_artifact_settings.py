"""EXECBOX_ARTIFACTS__*: the store a deployment's settings choose, how an incomplete S3 setting is
refused, the secret given as a file, the API's bounded bucket check, and the retention sweep's pace."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from botocore.stub import Stubber
from pydantic import ValidationError

from execbox.files.backend import ArtifactStoreUnusable, open_store, prepare
from execbox.files.blobs import LocalArtifactStore
from execbox.files.s3 import S3ArtifactStore
from execbox.files.settings import ArtifactSettings
from execbox.settings import Settings

S3 = {"EXECBOX_ARTIFACTS__STORE": "s3", "EXECBOX_ARTIFACTS__ENDPOINT": "http://127.0.0.1:9",
      "EXECBOX_ARTIFACTS__BUCKET": "artifacts"}  # fmt: skip


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_the_default_is_the_local_directory_of_execbox_artifacts_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = settings(monkeypatch, EXECBOX_ARTIFACTS_DIR=str(tmp_path))
    store = open_store(chosen.artifacts, chosen.artifacts_dir)
    assert isinstance(store, LocalArtifactStore) and store.root == tmp_path
    asyncio.run(prepare(store))  # nothing to check for a directory


def test_s3_from_the_environment_builds_an_s3_store_with_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = settings(monkeypatch, **S3, EXECBOX_ARTIFACTS__PREFIX="deploy-a", EXECBOX_ARTIFACTS__REGION="eu-1",
                      EXECBOX_ARTIFACTS__ACCESS_KEY="id", EXECBOX_ARTIFACTS__SECRET_KEY="shh")  # fmt: skip
    store = open_store(chosen.artifacts, chosen.artifacts_dir)
    assert isinstance(store, S3ArtifactStore)
    assert (store.bucket, store.prefix) == ("artifacts", "deploy-a/")
    credentials = store.client()._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == ("id", "shh")
    assert store.client().meta.region_name == "eu-1" and store.client().meta.endpoint_url == "http://127.0.0.1:9"
    assert "shh" not in repr(chosen)


@pytest.mark.parametrize("missing", ["EXECBOX_ARTIFACTS__ENDPOINT", "EXECBOX_ARTIFACTS__BUCKET"])
def test_s3_without_endpoint_or_bucket_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    env = {k: v for k, v in S3.items() if k != missing}
    with pytest.raises(ValidationError, match=f"EXECBOX_ARTIFACTS__STORE=s3 needs {missing}"):
        settings(monkeypatch, **env)


def test_an_access_key_without_a_secret_or_two_secrets_are_refused(tmp_path: Path) -> None:
    base = {"store": "s3", "endpoint": "http://h:1", "bucket": "b"}
    with pytest.raises(ValidationError, match="ACCESS_KEY and a secret"):
        ArtifactSettings.model_validate({**base, "access_key": "id"})
    with pytest.raises(ValidationError, match="ACCESS_KEY and a secret"):
        ArtifactSettings.model_validate({**base, "secret_key": "shh"})
    with pytest.raises(ValidationError, match="not both"):
        ArtifactSettings.model_validate(
            {**base, "access_key": "id", "secret_key": "shh", "secret_key_file": str(tmp_path / "s")}
        )


def test_the_secret_can_be_a_file_read_without_its_newline(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("from-a-file\n")
    given = {"store": "s3", "endpoint": "http://h:1", "bucket": "b", "access_key": "id",
             "secret_key_file": str(tmp_path / "secret")}  # fmt: skip
    section = ArtifactSettings.model_validate(given)
    assert section.secret() == "from-a-file"
    store = open_store(section, tmp_path)
    assert isinstance(store, S3ArtifactStore)
    assert store.client()._request_signer._credentials.secret_key == "from-a-file"
    (tmp_path / "secret").unlink()
    with pytest.raises(ValueError, match="SECRET_KEY_FILE: cannot read"):
        section.secret()


def test_an_unreachable_s3_store_fails_the_api_start_within_its_bound() -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3ArtifactStore(endpoint=f"http://127.0.0.1:{port}", bucket="b", access_key="k", secret_key="s",
                            connect_timeout_s=1, max_attempts=1)  # fmt: skip
    with pytest.raises(ArtifactStoreUnusable, match="bucket 'b' .*EXECBOX_ARTIFACTS__ENDPOINT.* is not usable"):
        asyncio.run(prepare(store, timeout_s=20))


def test_a_retention_sweep_of_the_bucket_is_not_repeated_within_its_interval() -> None:
    store = S3ArtifactStore(endpoint="http://127.0.0.1:9", bucket="b", prefix="p", access_key="k", secret_key="s",
                            sweep_interval_s=3600)  # fmt: skip
    with Stubber(store.client()) as stubber:
        stubber.add_response("list_objects_v2", {"IsTruncated": False}, {"Bucket": "b", "Prefix": "p/"})
        stubber.add_response("list_multipart_uploads", {}, {"Bucket": "b", "Prefix": "p/"})
        assert store.delete_older_than(0.0) == 0
        assert store.delete_older_than(0.0) == 0  # no request: the stubber has no response left to give
        stubber.assert_no_pending_responses()
