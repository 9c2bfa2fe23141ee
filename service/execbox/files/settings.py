"""The files room's settings section: where artifacts and input files' data are kept (`EXECBOX_ARTIFACTS__*`).

The local directory itself stays the root's `artifacts_dir` (EXECBOX_ARTIFACTS_DIR, as before this
section existed); this section chooses between it and an S3-compatible bucket.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator

_ENV = "EXECBOX_ARTIFACTS__"


class ArtifactBackend(StrEnum):
    LOCAL = "local"
    S3 = "s3"


class ArtifactSettings(BaseModel):
    store: ArtifactBackend = Field(
        ArtifactBackend.LOCAL,
        description="Where artifacts and input files' data are kept: `local` (artifacts in EXECBOX_ARTIFACTS_DIR, "
        "one host or a shared volume; input files in Redis) or `s3` (both in an S3-compatible bucket that API and "
        "workers on every host reach).",
    )
    endpoint: str | None = Field(
        None,
        description="S3 endpoint URL (store=s3), e.g. http://seaweedfs:8333 or https://s3.eu-west-1.amazonaws.com.",
    )
    bucket: str | None = Field(None, description="Bucket of the artifacts (store=s3); the API creates it if absent.")
    prefix: str = Field(
        "artifacts/", description="Key prefix in the bucket, so one bucket can hold several deployments (store=s3)."
    )
    region: str = Field("us-east-1", description="S3 region (store=s3); SeaweedFS and MinIO accept any.")
    access_key: str | None = Field(
        None, description="S3 access key id (store=s3). Unset: botocore's chain (environment, files, instance role)."
    )
    secret_key: SecretStr | None = Field(None, description="S3 secret access key (store=s3; or SECRET_KEY_FILE).")
    secret_key_file: Path | None = Field(
        None,
        description="File holding the S3 secret access key (store=s3), e.g. a mounted Docker or Kubernetes secret.",
    )
    sweep_interval_s: float = Field(
        300.0,
        ge=0,
        description="Least time between two retention sweeps of the bucket by one worker (store=s3), of artifacts "
        "and of input files whose meta expired: each sweep lists every key, so it is not repeated at each reaper pass.",
    )

    @model_validator(mode="after")
    def _complete(self) -> ArtifactSettings:
        if self.store is not ArtifactBackend.S3:
            return self
        for name in ("endpoint", "bucket"):
            if not getattr(self, name):
                raise ValueError(f"{_ENV}STORE=s3 needs {_ENV}{name.upper()}")
        if self.secret_key is not None and self.secret_key_file is not None:
            raise ValueError(f"give {_ENV}SECRET_KEY or {_ENV}SECRET_KEY_FILE, not both")
        has_secret = self.secret_key is not None or self.secret_key_file is not None
        if (self.access_key is None) != (not has_secret):
            raise ValueError(
                f"{_ENV}ACCESS_KEY and a secret ({_ENV}SECRET_KEY or {_ENV}SECRET_KEY_FILE) go together: "
                "give both, or neither for botocore's own credential chain"
            )
        return self

    def secret(self) -> str | None:
        """The secret access key, read from its file when given as one (its trailing newline dropped)."""
        if self.secret_key_file is not None:
            try:
                return self.secret_key_file.read_text().strip()
            except OSError as error:
                raise ValueError(f"{_ENV}SECRET_KEY_FILE: cannot read {self.secret_key_file}: {error}") from error
        return self.secret_key.get_secret_value() if self.secret_key is not None else None


__all__ = ["ArtifactBackend", "ArtifactSettings"]
