"""The configuration reference in docs/operations.md is the one Settings generates."""

from __future__ import annotations

from pathlib import Path

from execbox.core.config_reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_config_reference_is_current() -> None:
    text = DOC.read_text()
    start = text.index("<!-- config-reference:start -->\n") + len("<!-- config-reference:start -->\n")
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end] == render(), "run scripts/config-reference"
