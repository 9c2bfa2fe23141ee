"""A deployment set to EXECBOX_ARTIFACTS__STORE=s3: an API and a worker keep artifacts in a real
SeaweedFS cluster (scripts/seaweedfs), not on disk, and serve them to their tenant only."""

from __future__ import annotations

import hashlib
import random
import secrets
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import EXECBOX, Side, Stack, auth, free_port
from tests.integration.test_s3_artifacts import Cluster

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.slow]

MiB = 1 << 20
# 9 MiB: past one 8 MiB part, so the worker's upload is a multipart one whose checksum is set after.
WRITE = """
import random
from pathlib import Path
Path("out").mkdir(exist_ok=True)
Path("out/a.bin").write_bytes(random.Random(5).randbytes(9 << 20))
Path("out/b.txt").write_text("kept in the bucket\\n")
"""


def s3_env(cluster: Cluster, bucket: str, prefix: str, secret_file: Path, local_dir: Path) -> dict[str, str]:
    secret_file.write_text(cluster.env["SEAWEEDFS_SECRET_KEY"] + "\n")
    return {
        "EXECBOX_ARTIFACTS__STORE": "s3",
        "EXECBOX_ARTIFACTS__ENDPOINT": cluster.env["SEAWEEDFS_S3_ENDPOINT"],
        "EXECBOX_ARTIFACTS__BUCKET": bucket,
        "EXECBOX_ARTIFACTS__PREFIX": prefix,
        "EXECBOX_ARTIFACTS__REGION": cluster.env["SEAWEEDFS_REGION"],
        "EXECBOX_ARTIFACTS__ACCESS_KEY": cluster.env["SEAWEEDFS_ACCESS_KEY"],
        "EXECBOX_ARTIFACTS__SECRET_KEY_FILE": str(secret_file),
        "EXECBOX_ARTIFACTS_DIR": str(local_dir),
    }


def test_an_s3_deployment_keeps_artifacts_in_the_bucket_and_serves_them_to_their_tenant_only(
    seaweedfs: Cluster, side_stack: Callable[..., Side], stack: Stack, tmp_path: Path
) -> None:
    # A bucket of its own that does not exist yet: the API's start makes it.
    bucket, prefix = f"execbox-svc-{secrets.token_hex(4)}", "deployment-a"
    local = tmp_path / "artifacts"
    local.mkdir()
    side = side_stack(**s3_env(seaweedfs, bucket, prefix, tmp_path / "s3-secret", local))
    side.worker("s3")
    with side.client() as api:
        response = api.post("/v1/executions?wait=60", json={"language": "python", "code": WRITE})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "succeeded", (body["error"], body["stderr"][-1500:])
        expected = {"a.bin": random.Random(5).randbytes(9 * MiB), "b.txt": b"kept in the bucket\n"}
        listed = {a["name"]: a for a in body["artifacts"]}
        assert set(listed) == set(expected)

        # In the bucket, under this execution's prefix: one object per artifact, with its checksum
        # (the execution's rich-result files are kept there too, so other objects may be beside them).
        s3 = seaweedfs.client()
        under = f"{prefix}/{body['id']}/"
        objects = s3.list_objects_v2(Bucket=bucket, Prefix=under).get("Contents", [])
        by_key = {obj["Key"]: obj["Size"] for obj in objects}
        for name, data in expected.items():
            key = under + hashlib.sha256(name.encode()).hexdigest()
            digest = hashlib.sha256(data).hexdigest()
            assert by_key.get(key) == len(data), (name, by_key)
            assert s3.head_object(Bucket=bucket, Key=key)["Metadata"]["sha256"] == digest
            assert listed[name]["sha256"] == digest and listed[name]["size"] == len(data)
            # Through the API, streamed from the bucket: the same bytes.
            download = api.get(f"/v1/executions/{body['id']}/artifacts/{name}")
            assert download.status_code == 200, download.text
            assert hashlib.sha256(download.content).hexdigest() == digest
    assert list(local.iterdir()) == []  # nothing on the disk the local store would use

    # Another tenant: no such execution, and no such artifact.
    with httpx.Client(base_url=side.base_url, headers=auth(stack.keys["beta"]), timeout=30) as beta:
        assert beta.get(f"/v1/executions/{body['id']}/artifacts/b.txt").status_code == 404


def test_an_api_whose_s3_store_cannot_be_reached_does_not_start_and_says_why(
    stack: Stack,
) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    env = {**stack.env, "EXECBOX_ARTIFACTS__STORE": "s3", "EXECBOX_ARTIFACTS__ENDPOINT": f"http://127.0.0.1:{closed}",
           "EXECBOX_ARTIFACTS__BUCKET": "never", "EXECBOX_ARTIFACTS__ACCESS_KEY": "k",
           "EXECBOX_ARTIFACTS__SECRET_KEY": "s"}  # fmt: skip
    done = subprocess.run([EXECBOX, "api", "--port", str(free_port())], env=env, capture_output=True, text=True,
                          timeout=90)  # fmt: skip
    assert done.returncode != 0
    assert "bucket 'never'" in done.stdout + done.stderr and "is not usable" in done.stdout + done.stderr
