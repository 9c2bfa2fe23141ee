"""docs/security.md's table of Redis roles says what the ACL the code renders grants: every key and
channel pattern of each role, and nothing more."""

from __future__ import annotations

import re

from execbox.core.redis_roles import ROLES, acl_file
from execbox.keyschema import SCHEMA
from tests.conftest import ROOT


def _granted() -> dict[str, set[str]]:
    granted = {}
    for line in acl_file("p", dict.fromkeys(ROLES, "x"), SCHEMA).splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "user" or words[1] == "default":
            continue
        keys = {f"{m[1]} {m[2]}" if m[1] else m[2] for w in words if (m := re.match(r"^(%R|%W|%RW)?~(.+)$", w))}
        granted[words[1]] = keys | {w[1:] for w in words if w.startswith("&")}
    return granted


def _documented() -> dict[str, set[str]]:
    documented = {}
    for line in (ROOT / "docs" / "security.md").read_text().splitlines():
        row = re.match(r"^\| (\w+) \| (.*) \| (.*) \| .* \|$", line)
        if row and row[1] in ROLES:
            documented[row[1]] = set(re.findall(r"`([^`]+)`", f"{row[2]} {row[3]}"))
    return documented


def test_the_role_table_lists_exactly_what_each_role_is_granted() -> None:
    granted, documented = _granted(), _documented()
    assert set(granted) <= set(documented), f"roles missing from the table: {set(granted) - set(documented)}"
    for role, patterns in granted.items():
        assert documented[role] == patterns, (
            f"{role}: granted but not documented {sorted(patterns - documented[role])}, "
            f"documented but not granted {sorted(documented[role] - patterns)}"
        )
