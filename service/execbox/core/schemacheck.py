"""Tenants' JSON Schemas applied without a backtracking regex engine and within a time bound.

jsonschema runs `pattern`, `patternProperties` (and the `additionalProperties` and
`unevaluatedProperties` that look at them) on Python's `re`, which backtracks while holding the
interpreter lock: `"^(a+)+$"` against 25 a's and a `!` took 1.9 s, and every other request of the
process waited with it. Here the same keywords run jsonschema's own code with RE2 (linear time in
the subject, no lookaround or backreferences: such patterns are refused when a schema is submitted,
core.readable.schema_problems), every keyword checks a deadline (nested `oneOf`s over a deep value
are exponential whatever the regex engine), and `uniqueItems` compares by hashing rather than
pairwise. A schema that cannot be applied in time is an unmet expectation, never a wait for others.
"""

from __future__ import annotations

import functools
import reprlib
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import re2  # type: ignore[import-untyped]
from jsonschema import Draft202012Validator, _keywords, _utils, validators
from jsonschema.exceptions import ValidationError

CHECK_S = 2.0
"""Longest one instance is checked against one schema (an API thread or a worker's job): about 20
times what a large but plain schema takes on a big outputs object."""
MAX_ERRORS = 100
"""Errors collected per check (an array of a million wrong items would otherwise list a million)."""
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the tenant's 422, not a line in the service's log


class PatternError(ValueError):
    """A pattern RE2 cannot compile (lookaround, a backreference, too large a program)."""


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> Any:
    """The pattern compiled by RE2; PatternError (with RE2's reason) when it cannot be."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        raise PatternError(reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)) from None


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run the pattern, or None."""
    try:
        compiled(pattern)
    except PatternError as exc:
        return (
            f"pattern {pattern[:80]!r} cannot be checked without backtracking ({exc}); lookaround and "
            "backreferences are not supported: rewrite it without them"
        )
    return None


class _Re2Search:
    """What jsonschema's keywords call as `re.search`, answered by RE2."""

    @staticmethod
    def search(pattern: str, string: str) -> Any:
        return compiled(pattern).search(string)


def _on_re2(function: Callable[..., Any], **names: Any) -> Callable[..., Any]:
    """jsonschema's own keyword function, with `re` (and the helpers named) looked up in a namespace
    of ours: the library's code and messages, RE2's engine, and nothing patched globally."""
    namespace = {**function.__globals__, "re": _Re2Search, **names}
    copy = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                              function.__closure__)  # fmt: skip
    if function.__name__ not in names:
        namespace[function.__name__] = copy  # a recursive helper calls itself: here, the copy
    return copy


_evaluated_keys = _on_re2(_utils.find_evaluated_property_keys_by_schema)
_RE2_KEYWORDS: dict[str, Callable[..., Any]] = {
    "pattern": _on_re2(_keywords.pattern),
    "patternProperties": _on_re2(_keywords.patternProperties),
    "additionalProperties": _on_re2(
        _keywords.additionalProperties, find_additional_properties=_on_re2(_utils.find_additional_properties)
    ),
    "unevaluatedProperties": _on_re2(
        _keywords.unevaluatedProperties, find_evaluated_property_keys_by_schema=_evaluated_keys
    ),
}


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"{reprlib.repr(instance)} has non-unique elements")
                return
            seen.add(key)


def _canonical(value: Any) -> Any:
    """A hashable form under JSON Schema's equality: 1 equals 1.0, true does not equal 1, objects
    are unordered."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, list):
        return ("l", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("s", value)


class SchemaTooSlow(Exception):
    pass


_clock = threading.local()


def _timed(keyword: Callable[..., Any]) -> Callable[..., Iterator[ValidationError]]:
    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if time.monotonic() > getattr(_clock, "deadline", float("inf")):
            raise SchemaTooSlow
        errors = keyword(validator, value, instance, schema)
        if errors:
            yield from errors

    return timed


_KEYWORDS = {**Draft202012Validator.VALIDATORS, **_RE2_KEYWORDS, "uniqueItems": _unique_items}
Validator = validators.extend(Draft202012Validator, {n: _timed(k) for n, k in _KEYWORDS.items()})  # type: ignore[no-untyped-call]
"""Draft 2020-12 with RE2 patterns, hashed uniqueItems and a deadline on every keyword."""


def schema_errors(schema: Any, instance: Any, within_s: float = CHECK_S) -> list[ValidationError]:
    """The instance's violations of the schema (at most MAX_ERRORS), found within `within_s`. A
    schema that takes longer, or holds a pattern RE2 cannot run, is itself the one error: the caller
    reports it where it reports the others."""
    _clock.deadline = time.monotonic() + within_s
    try:
        return list(_first(Validator(schema).iter_errors(instance), MAX_ERRORS))
    except SchemaTooSlow:
        return [ValidationError(f"the schema took more than {within_s:g} s to check against this value; "
                                "simplify the schema (fewer nested oneOf/anyOf, no deep recursion)")]  # fmt: skip
    except PatternError as exc:
        return [ValidationError(f"a pattern of the schema cannot be checked without backtracking ({exc})")]
    except RecursionError:
        return [ValidationError("the value or the schema is nested too deeply to check")]
    finally:
        _clock.deadline = float("inf")


def _first(errors: Iterable[ValidationError], count: int) -> Iterator[ValidationError]:
    for index, error in enumerate(errors):
        if index >= count:
            return
        yield error


def is_valid(schema: Any, instance: Any, within_s: float = CHECK_S) -> bool:
    """No violation found within the bound (a schema too slow to apply does not hold)."""
    _clock.deadline = time.monotonic() + within_s
    try:
        return cast(bool, Validator(schema).is_valid(instance))
    except (SchemaTooSlow, PatternError, RecursionError):
        return False
    finally:
        _clock.deadline = float("inf")


__all__ = ["CHECK_S", "MAX_ERRORS", "PatternError", "Validator", "compiled", "is_valid", "pattern_problem",
           "schema_errors"]  # fmt: skip
