"""The languages this service runs, read from sandbox-images/*/metadata.yaml."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from execbox.catalog.schemas import LanguagePublic
from execbox.core.errors import UnknownLanguage


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    language: str
    version: str
    aliases: list[str] = []
    image: str
    file: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    command: list[str] = Field(min_length=1)
    smoke: list[str] = Field(min_length=1)
    env: dict[str, str] = {}
    session: list[str] | None = None
    """The program a session's sandbox runs (a kernel kept across executions); None: no sessions."""


@dataclass(frozen=True)
class Language:
    name: str
    version: str
    aliases: tuple[str, ...]
    image: str
    file: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    session: tuple[str, ...] | None = None

    def public(self) -> LanguagePublic:
        return LanguagePublic(
            name=self.name, version=self.version, aliases=list(self.aliases), image=self.image, file=self.file
        )


class LanguageConfigError(Exception):
    """sandbox-images/ metadata is unusable; the process must not start."""


class Languages:
    def __init__(self, languages: list[Language]) -> None:
        self._all = sorted(languages, key=lambda lang: lang.name)
        self._by_name = {name: lang for lang in languages for name in (lang.name, *lang.aliases)}

    @classmethod
    def load(cls, directory: Path) -> Languages:
        found = []
        for path in sorted(directory.glob("*/metadata.yaml")):
            try:
                meta = _Metadata.model_validate(yaml.safe_load(path.read_text()))
            except (OSError, yaml.YAMLError, ValidationError) as exc:
                raise LanguageConfigError(f"{path}: {exc}") from exc
            found.append(
                Language(
                    meta.language,
                    meta.version,
                    tuple(meta.aliases),
                    meta.image,
                    meta.file,
                    tuple(meta.command),
                    tuple(sorted(meta.env.items())),
                    tuple(meta.session) if meta.session else None,
                )
            )
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
