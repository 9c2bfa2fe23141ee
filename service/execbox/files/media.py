"""Media types a download is served with: a rich result's is the program's own text (its index names
it), so only RFC 6838's restricted names pass (type/subtype, no parameters, nothing that could end a
header line), and every download goes out as an attachment the browser may not sniff or run."""

from __future__ import annotations

import re

MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")
"""RFC 6838 section 4.2's type-name "/" subtype-name, matched whole (`fullmatch`)."""
OPAQUE = "application/octet-stream"
DOWNLOAD_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}
"""A download is never a document of the API's origin, even opened directly (html, svg, xml, js)."""


def media_type_problem(text: str) -> str | None:
    """What is wrong with a media type a program named, or None."""
    if MEDIA_TYPE.fullmatch(text):
        return None
    return f"media type {text[:80]!r} is not type/subtype (RFC 6838 names, no parameters)"


def served_as(media_type: str) -> str:
    """The Content-Type a stored media type is served with (records kept before the check: opaque)."""
    return media_type if MEDIA_TYPE.fullmatch(media_type) else OPAQUE


__all__ = ["DOWNLOAD_HEADERS", "MEDIA_TYPE", "OPAQUE", "media_type_problem", "served_as"]
