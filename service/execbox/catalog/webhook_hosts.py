"""Which hosts webhooks may target: the operator's allowlist (fnmatch patterns), nothing by default."""

from __future__ import annotations

import fnmatch
from urllib.parse import urlsplit


def host_allowed(url: str, patterns: list[str]) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return bool(host) and any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in patterns)
