"""The language catalog read from sandbox-images/: variants, aliases, versions, error rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from execbox.catalog.errors import UnknownLanguage, VariantNotAllowed
from execbox.catalog.languages import LanguageConfigError, Languages
from execbox.catalog.policies import PolicyConfigError, PolicySet
from execbox.executions.classify import classify
from execbox.executions.status import ErrorCategory
from execbox.sandbox.runtime import Limits, SandboxOutcome

ROOT = Path(__file__).resolve().parents[2]
LIMITS = Limits(timeout_s=5, cpu=1, cpu_time_s=3, memory_mb=64, pids=16, disk_mb=8, output_bytes=1000)


def folder(root: Path, name: str, **meta: object) -> Path:
    path = root / name
    path.mkdir(parents=True)
    base = {"language": name, "version": "1", "image": f"x/{name}", "file": "main", "command": ["run"],
            "smoke": ["ok"]}  # fmt: skip
    (path / "metadata.yaml").write_text(yaml.safe_dump({**base, **meta}))
    return path


def test_every_shipped_folder_loads_and_variants_are_named_language_at_variant() -> None:
    languages = Languages.load(ROOT / "sandbox-images")
    names = {lang.name for lang in languages}
    assert {"python", "python@slim", "javascript", "typescript", "bash", "r"} <= names
    slim = languages.get("py@slim")  # a variant answers to its language's aliases
    assert (slim.name, slim.base, slim.variant, slim.errors.family) == ("python@slim", "python", "slim", "python")
    assert languages.get("TS").errors.family == "javascript"
    with pytest.raises(UnknownLanguage):
        languages.get("python@gpu")


def test_two_folders_claiming_one_name_stop_the_start(tmp_path: Path) -> None:
    folder(tmp_path, "a", aliases=["x"])
    folder(tmp_path, "b", aliases=["x"])
    with pytest.raises(LanguageConfigError, match="'x'"):
        Languages.load(tmp_path)


def test_versions_come_from_the_folder_and_a_broken_file_is_a_config_error(tmp_path: Path) -> None:
    built = folder(tmp_path, "a")
    folder(tmp_path, "b")
    (built / "versions.json").write_text(json.dumps({"runtime": {"name": "A", "version": "1.2.3"},
                                                     "packages": {"z": "1", "y": "2"}}))  # fmt: skip
    languages = Languages.load(tmp_path)
    shown = languages.get("a").public()
    assert shown.runtime is not None and (shown.runtime.name, shown.runtime.version) == ("A", "1.2.3")
    assert shown.packages == {"y": "2", "z": "1"}
    assert languages.get("b").public().runtime is None  # not built yet: said, not invented
    (built / "versions.json").write_text("{}")
    with pytest.raises(LanguageConfigError, match="rebuild the image"):
        Languages.load(tmp_path)


def test_an_exception_pattern_without_a_message_group_is_refused(tmp_path: Path) -> None:
    folder(tmp_path, "a", errors={"exception": "^Error: .*$"})
    with pytest.raises(LanguageConfigError, match="msg"):
        Languages.load(tmp_path)


def failed(stderr: str, exit_code: int = 1) -> SandboxOutcome:
    return SandboxOutcome(exit_code=exit_code, stdout=b"", stderr=stderr.encode(), stdout_total=0,
                      stderr_total=len(stderr))  # fmt: skip


@pytest.mark.parametrize(
    ("language", "stderr", "category", "message"),
    [
        ("r", "Error in f() : boom\nCalls: f\nExecution halted\n", ErrorCategory.CODE_EXCEPTION, "boom"),
        ("r", "Error: object 'y' not found\nExecution halted\n", ErrorCategory.CODE_EXCEPTION, "object 'y' not found"),
        ("r", 'Error: unexpected numeric constant in "x <- 1 2"\nExecution halted\n', ErrorCategory.CODE_SYNTAX, None),
        ("r", "Warning message:\nsomething\n", ErrorCategory.CODE_EXIT_NONZERO, None),
        ("typescript", '✘ [ERROR] Unexpected ";"\n\n    main.ts:1:18:\n', ErrorCategory.CODE_SYNTAX, None),
        ("typescript", "main.ts:1\nRangeError: bad 1\n    at f (main.ts:1:9)\n", ErrorCategory.CODE_EXCEPTION, "bad 1"),
    ],
)
def test_metadata_error_rules_classify_operator_languages(
    language: str, stderr: str, category: ErrorCategory, message: str | None
) -> None:
    rules = Languages.load(ROOT / "sandbox-images").get(language).errors
    verdict = classify(failed(stderr), rules, LIMITS)
    assert verdict.error is not None and verdict.error.category is category
    if message is not None:
        assert verdict.error.details["message"] == message


def test_a_variant_runs_only_under_a_policy_that_lists_it(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies)
    (policies / "closed.yaml").write_text(yaml.safe_dump({"variants": []}))
    (policies / "every.yaml").write_text(yaml.safe_dump({"variants": ["python@*"]}))
    (policies / "inherits.yaml").write_text(yaml.safe_dump({"defaults": {"timeout_s": 5}}))
    loaded = PolicySet.load(policies)
    loaded.check_language("default", "python@slim")  # the shipped default lists it
    loaded.check_language("inherits", "python@slim")  # no list: the default's
    loaded.check_language("every", "python@anything")
    loaded.check_language("closed", "python")  # a language's default image needs no entry
    with pytest.raises(VariantNotAllowed) as caught:
        loaded.check_language("closed", "python@slim", "steps.0.run.language")
    (problem,) = caught.value.problems
    assert problem.field == "steps.0.run.language" and "closed.yaml" in problem.message
    (policies / "bad.yaml").write_text(yaml.safe_dump({"variants": ["slim"]}))
    with pytest.raises(PolicyConfigError, match="language@variant"):
        PolicySet.load(policies)


def test_a_session_context_reads_errors_as_its_own_language_writes_them(tmp_path: Path) -> None:
    folder(tmp_path, "py", contexts=["javascript", "bash"], errors={"family": "python"})
    folder(tmp_path, "javascript", errors={"family": "javascript"})
    languages = Languages.load(tmp_path)
    assert languages.get("py").contexts == ("javascript", "bash")
    assert languages.get("py").public().session_contexts == [], "no session program: no contexts offered"
    assert languages.error_rules("py", None).family == "python"
    assert languages.error_rules("py", "py:other").family == "python", "another namespace of the same language"
    assert languages.error_rules("py", "javascript:b") is languages.get("javascript").errors
    assert languages.error_rules("py", "bash").family == "bash", "not served alone: the rules every language has"
    run = failed("TypeError: x is not a function\n    at cell.js:1:1\n")
    error = classify(run, languages.error_rules("py", "javascript"), LIMITS).error
    assert error is not None and (error.category, error.details["type"]) == (ErrorCategory.CODE_EXCEPTION, "TypeError")


def test_a_context_language_the_kernel_does_not_keep_is_a_config_error(tmp_path: Path) -> None:
    folder(tmp_path, "py", contexts=["ruby"])
    with pytest.raises(LanguageConfigError, match="contexts"):
        Languages.load(tmp_path)


def test_a_preloads_costs_reach_the_warm_containers_environment_in_module_order(tmp_path: Path) -> None:
    folder(tmp_path, "a", preload={"command": ["run", "-p"], "modules": ["big", "small"],
                                   "costs_ms": {"small": 7, "start": 20, "big": 300}})  # fmt: skip
    folder(tmp_path, "b", preload={"command": ["run"], "modules": ["m"]})
    languages = Languages.load(tmp_path)
    env = dict(languages.get("a").preload_env())
    assert (env["EXECBOX_PRELOAD_MODULES"], env["EXECBOX_PRELOAD_COSTS"]) == ("big,small", "20,300,7")
    assert "EXECBOX_PRELOAD_COSTS" not in dict(languages.get("b").preload_env())  # none declared: never waits


@pytest.mark.parametrize(
    ("preload", "says"),
    [
        ({"modules": ["m"], "costs_ms": {"m": 1}}, "start"),
        ({"modules": ["m"], "costs_ms": {"start": 1, "m": 1, "other": 1}}, "nothing else"),
        ({"modules": ["m"], "costs_ms": {"start": -1, "m": 1}}, "0-60000"),
        ({"modules": ["m,n"]}, "module name"),
    ],
)
def test_a_preload_whose_modules_or_costs_the_launcher_cannot_read_is_refused(
    tmp_path: Path, preload: dict[str, object], says: str
) -> None:
    folder(tmp_path, "a", preload={"command": ["run"], **preload})
    with pytest.raises(LanguageConfigError, match=says):
        Languages.load(tmp_path)
