"""Sandbox images as directories: each image the bubblewrap helper runs, unpacked once per image id
from the same Docker engine (and so the same images) the Docker runtime uses.

Only images tagged under the configured prefix (`execbox/sandbox-`) are unpacked, by GNU tar (no
absolute paths, no `..`) into a directory only root may enter, with every setuid and setgid bit
cleared and every device node removed after (a sandbox's root file system is read-only and runs
under no_new_privs; /dev is bubblewrap's own). An
unpacking lands in a temporary directory that is renamed into place, so a helper stopped halfway
leaves nothing a run could use.

Helpers on one host may share the directory (`execbox bwrap-helper --images`): an image is
unpacked under an exclusive lock on `<id>.lock` (flock, released if its holder dies), so the
second helper asking for it waits for the first's tree instead of unpacking it again.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import docker
from docker.errors import DockerException

IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
STALE_PARTIAL_S = 3600.0
"""A partial tree this old was left by a helper that died mid-unpacking (none takes minutes)."""


class RootfsError(Exception):
    """The image cannot be run: unknown, not a sandbox image, or its export failed."""


class Rootfs:
    def __init__(self, root: Path, engine_url: str, image_prefix: str) -> None:
        self._root = root
        self._root.mkdir(parents=True, exist_ok=True)
        self._root.chmod(0o700)  # the trees are bubblewrap's (root's) to mount; no host user walks them
        for partial in self._root.glob("*.partial-*"):
            if time.time() - partial.lstat().st_mtime > STALE_PARTIAL_S:
                shutil.rmtree(partial, ignore_errors=True)
        self._engine_url = engine_url
        self._prefix = image_prefix
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, image_id: str) -> Path:
        """The image's tree, unpacked now if it is not yet."""
        if not IMAGE_ID.fullmatch(image_id):
            raise RootfsError(f"image {image_id[:80]!r} is not an image id (sha256:<64 hex>)")
        target = self._root / image_id.removeprefix("sha256:")
        if target.is_dir():
            return target
        with self._guard:
            lock = self._locks.setdefault(image_id, threading.Lock())
        with lock:
            if target.is_dir():
                return target
            client = docker.DockerClient(base_url=self._engine_url, timeout=300)
            try:
                image = client.images.get(image_id)  # checked before any file is named after it
                if not any(tag.startswith(self._prefix) for tag in image.tags):
                    raise RootfsError(f"image {image_id} is not a sandbox image (no tag under {self._prefix!r})")
                with open(self._root / f"{target.name}.lock", "a") as shared:
                    fcntl.flock(shared, fcntl.LOCK_EX)  # another helper on this directory may be unpacking it
                    if not target.is_dir():
                        self._unpack(client, image_id, target)
            except DockerException as exc:
                raise RootfsError(f"image {image_id} could not be exported from the engine ({exc})") from exc
            finally:
                client.close()
        return target

    def _unpack(self, client: docker.DockerClient, image_id: str, target: Path) -> None:
        container = None
        partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=self._root))
        try:
            container = client.containers.create(image_id, command=["/bin/true"], network_disabled=True)
            # GNU tar, for speed (a Python unpacking of the 1.2 GB Python image took 25 s): it drops
            # leading slashes and members with `..`; setuid and setgid bits are cleared after.
            with tempfile.TemporaryFile() as errors:  # a file, not a pipe: tar may say much, and must not block
                untar = subprocess.Popen(["/usr/bin/tar", "-x", "--numeric-owner", "-p", "-C", str(partial)],
                                         stdin=subprocess.PIPE, stderr=errors)  # fmt: skip
                assert untar.stdin is not None
                try:
                    for chunk in cast(Iterator[bytes], container.export(chunk_size=1 << 20)):
                        untar.stdin.write(chunk)
                finally:
                    untar.stdin.close()
                if untar.wait() != 0:
                    errors.seek(0)
                    said = errors.read()[-300:].decode(errors="replace")
                    raise RootfsError(f"image {image_id} could not be unpacked: {said}")
            subprocess.run(["/usr/bin/find", str(partial), "-xdev", "-perm", "/6000", "-exec", "chmod", "ug-s", "{}",
                            "+"], check=True, capture_output=True)  # fmt: skip
            subprocess.run(["/usr/bin/find", str(partial), "-xdev", "(", "-type", "b", "-o", "-type", "c", ")",
                            "-delete"], check=True, capture_output=True)  # fmt: skip
            partial.chmod(0o755)  # the sandbox's `/`; host users are kept out by rootfs/ (0700) above it
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
            if container is not None:
                try:
                    container.remove(force=True)
                except DockerException:
                    pass
