"""The tenancy room's Redis keys: API keys, the admission counters behind quotas and the storage budget."""

from __future__ import annotations

from execbox.core.keys import KeyBuilder, KeySpec

SCHEMA: tuple[KeySpec, ...] = (
    KeySpec("t:rate:{tenant}:{minute}", "string counter", "120 s", ("api",), (), "submissions in a tenant's minute"),
    KeySpec(
        "t:active:{tenant}",
        "zset id -> admission time",
        "none",
        ("api", "worker"),
        (),
        "a tenant's queued or running executions (its running quota)",
    ),
    KeySpec(
        "t:kept:{tenant}",
        "hash expiry bucket -> bytes",
        "the latest bucket it counts",
        ("api", "worker"),
        (),
        "bytes a tenant keeps in Redis by when they expire: its storage budget (execbox.tenancy.budget)",
    ),
    KeySpec(
        "t:runrate:{tenant}:{minute}", "string counter", "120 s", ("api",), (), "runs created in a tenant's minute"
    ),
    KeySpec("apikey:{digest}", "string (JSON)", "none", ("api", "admin"), (), "an API key, by its SHA-256"),
    KeySpec("apikeys", "set of digests", "none", ("api", "admin"), (), "every API key, for listing"),
    KeySpec("console:{digest}", "string (JSON)", "8 h", ("api",), (), "a console sign-in, by its cookie's SHA-256"),
    KeySpec(
        "console:rate:{source}:{window}",
        "string counter",
        "2 windows",
        ("api",),
        (),
        "failed console sign-ins in a window, from one source (its address's SHA-256) or `all` (admin-token tries)",
    ),
)


class TenancyKeys(KeyBuilder):
    def rate(self, tenant: str, minute: int) -> str:
        return self._t("rate", tenant, str(minute))

    def active(self, tenant: str) -> str:
        return self._t("active", tenant)

    def kept(self, tenant: str) -> str:
        return self._t("kept", tenant)

    def run_rate(self, tenant: str, minute: int) -> str:
        return self._t("runrate", tenant, str(minute))

    def api_key(self, digest: str) -> str:
        return self._k("apikey", digest)

    @property
    def api_keys(self) -> str:
        return self._k("apikeys")

    def console_signin(self, digest: str) -> str:
        return self._k("console", digest)

    def console_failures(self, source: str, window: int) -> str:
        return self._k("console", "rate", source, str(window))


__all__ = ["SCHEMA", "TenancyKeys"]
