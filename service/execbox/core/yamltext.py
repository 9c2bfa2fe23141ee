"""YAML documents read with libyaml's safe loader when PyYAML has it (several times faster than the
pure-Python one, which every API start and every test's app paid for the languages' and policies'
files), else with the pure-Python safe loader. Both build only plain data (no Python objects)."""

from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAMLError = yaml.YAMLError


def safe_load(text: str) -> Any:
    """The document in `text` as plain data (yaml.YAMLError when it is not YAML)."""
    return yaml.load(text, Loader=_LOADER)


__all__ = ["YAMLError", "safe_load"]
