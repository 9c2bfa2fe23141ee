"""The script library's Redis keys: each script's versions, their use counts, a tenant's names."""

from __future__ import annotations

from execbox.core.keys import KeySpec
from execbox.executions.keys import ExecutionKeys

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec(
        "t:script:{tenant}:{name}",
        "hash version -> JSON ScriptVersion",
        "none",
        ("api",),
        (),
        "a script's versions (immutable but for status and evidence)",
    ),
    KeySpec(
        "t:scriptuse:{tenant}:{name}", "hash version -> count", "none", ("api",), (), "executions started per version"
    ),
    KeySpec("t:scripts:{tenant}", "set of names", "none", ("api",), (), "a tenant's scripts, for search"),
)


class ScriptKeys(ExecutionKeys):
    def script(self, tenant: str, name: str) -> str:
        return self._t("script", tenant, name)

    def script_use(self, tenant: str, name: str) -> str:
        return self._t("scriptuse", tenant, name)

    def scripts(self, tenant: str) -> str:
        return self._t("scripts", tenant)


__all__ = ["SCHEMA", "ScriptKeys"]
