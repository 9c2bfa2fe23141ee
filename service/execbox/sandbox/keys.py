"""The sandbox room's Redis keys: the uids live containers hold."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec("uid:{uid}", "string", "4 h", ("worker",), (), "a sandbox uid held by a live container"),
)


class SandboxKeys(KeyBuilder):
    def uid(self, uid: int) -> str:
        return self._k("uid", str(uid))


__all__ = ["SCHEMA", "SandboxKeys"]
