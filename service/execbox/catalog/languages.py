"""The languages this service runs, read from sandbox-images/*/metadata.yaml.

Each folder is one language or one variant of a language: `language: python` with `variant: slim`
is selected as `python@slim` (aliases work too: `py@slim`), and only where the named policy
allows it (catalog.policies). What a built image holds (runtime and package versions) is read
from the folder's versions.json, which sandbox-images/build.sh writes from the image itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from execbox.catalog.errors import UnknownLanguage
from execbox.catalog.schemas import LanguagePublic, RuntimePublic
from execbox.core.yamltext import YAMLError, safe_load

VARIANT_MARK = "@"


class _Errors(BaseModel):
    """How the language's failures read on stderr, beyond what the engine reports."""

    model_config = ConfigDict(extra="forbid")

    family: str | None = None
    """Built-in reading of stderr to reuse: python, javascript or bash (default: the language's name)."""
    syntax: list[str] = []
    """Patterns (re.M): a failed run whose stderr matches one did not compile (code.syntax)."""
    exception: str | None = None
    """A pattern with a `msg` group (and optionally `type`): an uncaught error (code.exception)."""

    @field_validator("syntax")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            re.compile(pattern)
        return patterns

    @field_validator("exception")
    @classmethod
    def _has_msg(cls, pattern: str | None) -> str | None:
        if pattern is not None and "msg" not in re.compile(pattern).groupindex:
            raise ValueError("the exception pattern needs a (?P<msg>...) group")
        return pattern


class _Preload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(min_length=1)
    """The interpreter a warm container starts before its code arrives (the launcher's protocol)."""
    modules: list[str] = Field([], max_length=32)
    """What it imports ahead of the run, in this order (a module may need those before it)."""
    costs_ms: dict[str, int] = Field({}, max_length=33)
    """The wall time a fresh start spends on its own start (`start`) and on each module's import,
    measured on a quiet machine: with them the launcher weighs waiting for a preload that is not
    done against a fresh start (launch.py, _hand_over). Without them it never waits."""

    @field_validator("modules")
    @classmethod
    def _module_names(cls, modules: list[str]) -> list[str]:
        for name in modules:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
                raise ValueError(f"{name!r} is not a module name")
        return modules

    @model_validator(mode="after")
    def _costs_named(self) -> _Preload:
        if self.costs_ms and set(self.costs_ms) != {"start", *self.modules}:
            raise ValueError("costs_ms names `start` and every module, and nothing else")
        if any(ms < 0 or ms > 60_000 for ms in self.costs_ms.values()):
            raise ValueError("costs_ms are 0-60000 ms")
        return self


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: str = Field(pattern=r"^[a-z][a-z0-9_+-]*$")
    variant: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$")
    version: str
    aliases: list[str] = []
    image: str
    file: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    command: list[str] = Field(min_length=1)
    smoke: list[str] = Field(min_length=1)
    probe: list[str] | None = None
    """Prints the image's runtime and packages as JSON (run by sandbox-images/build.sh)."""
    env: dict[str, str] = {}
    session: list[str] | None = None
    """The program a session's sandbox runs (a kernel kept across executions); None: no sessions."""
    errors: _Errors = _Errors()
    preload: _Preload | None = None
    contexts: list[Literal["python", "javascript", "bash"]] = []
    """The languages of the session contexts its kernel keeps beside its own (kernel.py)."""


@dataclass(frozen=True)
class ErrorRules:
    family: str
    syntax: tuple[re.Pattern[str], ...] = ()
    exception: re.Pattern[str] | None = None


@dataclass(frozen=True)
class Versions:
    runtime: str
    runtime_version: str
    packages: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Language:
    name: str
    """What a request sends: `python`, or `python@slim` for a variant."""
    version: str
    aliases: tuple[str, ...]
    image: str
    file: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    session: tuple[str, ...] | None = None
    variant: str | None = None
    errors: ErrorRules = field(default_factory=lambda: ErrorRules("unknown"))
    versions: Versions | None = None
    preload: tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]] | None = None
    """(command, modules, costs) of the interpreter warm containers start ahead of their run; the
    costs, when declared, are the start's then each module's, in ms."""
    contexts: tuple[str, ...] = ()
    """The languages a session's `session_context` may name (none: the session's one context)."""

    def preload_env(self) -> tuple[tuple[str, str], ...]:
        """A warm container's environment for its preloaded interpreter (none: no preload)."""
        if self.preload is None:
            return ()
        command, modules, costs = self.preload
        env = (*self.env, ("EXECBOX_PRELOAD", " ".join(command)), ("EXECBOX_PRELOAD_MODULES", ",".join(modules)))
        return (*env, ("EXECBOX_PRELOAD_COSTS", ",".join(map(str, costs)))) if costs else env

    @property
    def base(self) -> str:
        return self.name.split(VARIANT_MARK, 1)[0]

    def public(self) -> LanguagePublic:
        versions = self.versions
        return LanguagePublic(
            name=self.name,
            language=self.base,
            variant=self.variant,
            version=self.version,
            aliases=list(self.aliases),
            image=self.image,
            file=self.file,
            sessions=self.session is not None,
            session_contexts=list(self.contexts) if self.session is not None else [],
            runtime=RuntimePublic(name=versions.runtime, version=versions.runtime_version) if versions else None,
            packages=dict(versions.packages) if versions else None,
        )


class LanguageConfigError(Exception):
    """sandbox-images/ metadata is unusable; the process must not start."""


def _versions(path: Path) -> Versions | None:
    """The folder's versions.json (absent until its image is built)."""
    if not path.is_file():
        return None
    try:
        raw: Any = json.loads(path.read_text())
        return Versions(
            str(raw["runtime"]["name"]),
            str(raw["runtime"]["version"]),
            tuple(sorted((str(k), str(v)) for k, v in raw["packages"].items())),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LanguageConfigError(f"{path}: {exc!r}; rebuild the image (sandbox-images/build.sh)") from exc


def _language(path: Path) -> Language:
    try:
        meta = _Metadata.model_validate(safe_load(path.read_text()))
    except (OSError, YAMLError, ValidationError) as exc:
        raise LanguageConfigError(f"{path}: {exc}") from exc
    errors = meta.errors
    return Language(
        f"{meta.language}{VARIANT_MARK}{meta.variant}" if meta.variant else meta.language,
        meta.version,
        tuple(meta.aliases),
        meta.image,
        meta.file,
        tuple(meta.command),
        tuple(sorted(meta.env.items())),
        tuple(meta.session) if meta.session else None,
        meta.variant,
        ErrorRules(
            errors.family or meta.language,
            tuple(re.compile(p, re.M) for p in errors.syntax),
            re.compile(errors.exception, re.M) if errors.exception else None,
        ),
        _versions(path.parent / "versions.json"),
        _preload(meta.preload),
        tuple(meta.contexts),
    )


def _preload(preload: _Preload | None) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]] | None:
    if preload is None:
        return None
    costs = tuple(preload.costs_ms[n] for n in ("start", *preload.modules)) if preload.costs_ms else ()
    return tuple(preload.command), tuple(preload.modules), costs


class Languages:
    def __init__(self, languages: list[Language]) -> None:
        self._all = sorted(languages, key=lambda lang: lang.name)
        self._by_name: dict[str, Language] = {}
        for lang in self._all:
            for name in (lang.name, *lang.aliases):
                if name in self._by_name:
                    raise LanguageConfigError(f"two sandbox-images folders are named {name!r}")
                self._by_name[name] = lang
        # A variant answers to its language's aliases too: py@slim is python@slim.
        defaults = {lang.name: lang for lang in self._all if lang.variant is None}
        for lang in self._all:
            if lang.variant is not None and lang.base in defaults:
                for alias in defaults[lang.base].aliases:
                    self._by_name.setdefault(f"{alias}{VARIANT_MARK}{lang.variant}", lang)

    @classmethod
    def load(cls, directory: Path) -> Languages:
        found = [_language(path) for path in sorted(directory.glob("*/metadata.yaml"))]
        if not found:
            raise LanguageConfigError(f"no */metadata.yaml under {directory}")
        return cls(found)

    def __iter__(self) -> Iterator[Language]:
        return iter(self._all)

    def get(self, name: str) -> Language:
        lang = self._by_name.get(name.lower())
        if lang is None:
            raise UnknownLanguage(name, [lang.name for lang in self._all])
        return lang

    def error_rules(self, name: str, context: str | None = None) -> ErrorRules:
        """How a run of `name` reports its errors; in a session context of another language, as that
        language does (its rules if it is served here, else the ones every language has)."""
        language = self.get(name)
        other = (context or "").split(":", 1)[0]
        if not other or other == language.base:
            return language.errors
        found = self._by_name.get(other)
        return found.errors if found is not None else ErrorRules(other)
