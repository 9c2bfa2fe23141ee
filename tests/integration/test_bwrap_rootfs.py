"""Unpacked sandbox images shared by bubblewrap helpers (`execbox bwrap-helper --images`), on the
real engine: one unpacking however many helpers ask at once, no file for an image that is not a
sandbox image, and a dead helper's partial tree cleared once it is old."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import docker
import pytest

from execbox.sandbox.bwrap.rootfs import STALE_PARTIAL_S, Rootfs, RootfsError
from tests.conftest import ENGINE

PREFIX = "execbox/sandbox-"


def test_two_helpers_asking_for_one_image_at_once_unpack_it_once(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = str(docker_client.images.get("execbox/sandbox-bash").id)
    unpacked: list[str] = []
    real = Rootfs._unpack

    def counted(self: Rootfs, client: docker.DockerClient, image_id: str, target: Path) -> None:
        unpacked.append(image_id)
        real(self, client, image_id, target)

    monkeypatch.setattr(Rootfs, "_unpack", counted)
    shared = tmp_path / "images"
    helpers = [Rootfs(shared, ENGINE, PREFIX), Rootfs(shared, ENGINE, PREFIX)]  # two helpers' own locks
    start = threading.Barrier(2)
    paths: list[Path] = []

    def ask(rootfs: Rootfs) -> None:
        start.wait()
        paths.append(rootfs.path(image))

    threads = [threading.Thread(target=ask, args=(h,)) for h in helpers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert unpacked == [image]
    assert len(paths) == 2 and paths[0] == paths[1] and (paths[0] / "bin" / "bash").is_file()
    assert not list(shared.glob("*.partial-*"))


def test_an_image_that_is_no_sandbox_image_leaves_no_file(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    base = str(docker_client.images.get("local/debian:trixie").id)
    rootfs = Rootfs(tmp_path / "images", ENGINE, PREFIX)
    with pytest.raises(RootfsError, match="not a sandbox image"):
        rootfs.path(base)
    assert list((tmp_path / "images").iterdir()) == []


def test_a_dead_helpers_partial_tree_is_cleared_once_it_is_old(tmp_path: Path) -> None:
    images = tmp_path / "images"
    old, fresh = images / f"{'a' * 64}.partial-x1", images / f"{'b' * 64}.partial-x2"
    for partial in (old, fresh):
        (partial / "usr").mkdir(parents=True)
    then = time.time() - STALE_PARTIAL_S - 60
    os.utime(old, (then, then))
    Rootfs(images, ENGINE, PREFIX)
    assert not old.exists() and fresh.is_dir()  # a fresh one may be another helper's unpacking now
