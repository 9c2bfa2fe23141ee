"""Secret header values sealed to the egress proxy (libsodium sealed boxes, via PyNaCl).

Whoever registers a secret (the operator's CLI) seals it with the proxy's public key; Redis, its
append-only file and every other component hold only the ciphertext; the proxy alone holds the
private key (a file mounted into its container only) and opens a value when it adds the header.
Rotation: make a new key pair, re-seal every stored value with `execbox secrets reseal` (it needs
the old private key and the new public key), then give the proxy the new private key.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox


class SealingError(ValueError):
    """A key or a sealed value that cannot be used; the message says what to do."""


def _decode(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError as exc:
        raise SealingError(f"{what} is not base64") from exc
    if len(raw) != 32:
        raise SealingError(f"{what} must be 32 bytes (base64), got {len(raw)}")
    return raw


def generate(path: Path) -> str:
    """Write a new private key to `path` (mode 0400) unless one is there; return its public key."""
    if not path.exists():
        key = PrivateKey.generate()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w") as out:
            out.write(base64.b64encode(bytes(key)).decode() + "\n")
    return public_key_of(path)


def public_key_of(path: Path) -> str:
    return base64.b64encode(bytes(_private(path).public_key)).decode()


def _private(path: Path) -> PrivateKey:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SealingError(f"cannot read the egress private key {path}: {exc.strerror}") from exc
    return PrivateKey(_decode(text, f"the private key in {path}"))


def seal(public_key: str, value: str) -> str:
    box = SealedBox(PublicKey(_decode(public_key, "the egress public key (EXECBOX_EGRESS__PUBLIC_KEY)")))
    return base64.b64encode(box.encrypt(value.encode())).decode()


class Opener:
    """The proxy's side: opens values sealed to its key."""

    def __init__(self, private_key_file: Path) -> None:
        self._box = SealedBox(_private(private_key_file))

    def open(self, sealed: str) -> str:
        try:
            return self._box.decrypt(base64.b64decode(sealed)).decode()
        except (CryptoError, ValueError) as exc:
            raise SealingError(
                "a stored secret cannot be opened with this proxy's key (sealed to another key?); "
                "re-seal it with `execbox secrets reseal` or set it again"
            ) from exc


__all__ = ["Opener", "SealingError", "generate", "public_key_of", "seal"]
