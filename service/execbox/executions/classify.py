"""Turn a sandbox run's raw outcome into a status and a categorized error.

Status, exit code, OOM and timeout come from the engine and the worker's clock. Only the finer
split of a failed program (which exception, a syntax error, a failed fork or a full disk) reads
its stderr, per language; a program can fake that split for itself, never for anyone else.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass
from typing import Any

from execbox.catalog.languages import ErrorRules
from execbox.executions.schemas import ExecutionError
from execbox.executions.status import ErrorCategory, ExecutionStatus
from execbox.sandbox.runtime import Limits, SandboxOutcome

_SIGNAL_BASE = 128  # the init process reports death by signal N as exit code 128 + N
_PY_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_JS_EXC = re.compile(r"^(?:Uncaught )?(?P<type>[A-Z][\w$]*(?:Error|Exception))(?: \[[\w$]+\])?:\s?(?P<msg>.*)$")
_PY_SYNTAX = {"SyntaxError", "IndentationError", "TabError"}
_PIDS_PATTERNS = (
    re.compile(r"^BlockingIOError: \[Errno 11\] Resource temporarily unavailable", re.M),  # python fork
    re.compile(r"^RuntimeError: can't start new thread", re.M),  # python thread
    re.compile(r"fork: (retry: )?Resource temporarily unavailable"),  # bash
    re.compile(r"\b(spawn|fork)\b.*\bEAGAIN\b"),  # node child_process
)
_DISK_PATTERNS = (
    re.compile(r"^OSError: \[Errno 2[78]\] (No space left on device|File too large)", re.M),  # python
    re.compile(r"\bE(NOSPC|FBIG)\b"),  # node
    re.compile(r": (No space left on device|File too large)$", re.M),  # coreutils, bash
)


@dataclass(frozen=True)
class Classified:
    status: ExecutionStatus
    error: ExecutionError | None
    signal: str | None


def signal_name(exit_code: int | None) -> str | None:
    if exit_code is None or not _SIGNAL_BASE < exit_code <= _SIGNAL_BASE + 64:
        return None
    try:
        return _signal.Signals(exit_code - _SIGNAL_BASE).name
    except ValueError:
        return None


def _error(category: ErrorCategory, text: str, retryable: bool = False, **details: Any) -> ExecutionError:
    return ExecutionError(category=category, message=text, retryable=retryable, details=details)


def classify(outcome: SandboxOutcome, language: str | ErrorRules, limits: Limits) -> Classified:
    """`language`: the language's error rules (its metadata's `errors`), or a built-in family's name."""
    sig = signal_name(outcome.exit_code)
    failed = ExecutionStatus.FAILED
    if outcome.cancelled:
        return Classified(
            ExecutionStatus.CANCELLED,
            _error(ErrorCategory.CANCELLED, "cancelled by the client while running; the program was killed"),
            sig,
        )
    if outcome.timed_out:
        return Classified(
            failed,
            _error(
                ErrorCategory.LIMIT_TIMEOUT,
                f"wall-clock limit of {limits.timeout_s:g} s "
                "reached; the program was killed. Raise policy.timeout_s or do less per "
                "run",
                timeout_s=limits.timeout_s,
            ),
            sig,
        )
    if outcome.stdout_truncated or outcome.stderr_truncated:
        streams = [n for n, t in (("stdout", outcome.stdout_truncated), ("stderr", outcome.stderr_truncated)) if t]
        return Classified(
            failed,
            _error(
                ErrorCategory.LIMIT_OUTPUT,
                f"{' and '.join(streams)} passed the cap of "
                f"{limits.output_bytes} bytes; the program was stopped and the first "
                "bytes are returned. Write large results to files, or raise "
                "policy.output_bytes",
                streams=streams,
                cap_bytes=limits.output_bytes,
            ),
            sig,
        )
    if outcome.launcher_fault and not outcome.oom_killed:
        return Classified(
            failed,
            _error(ErrorCategory.SANDBOX_ERROR, f"{outcome.launcher_fault}; the program's outcome is unknown; retry",
                   retryable=True, reason="launcher_fault"),
            None,
        )  # fmt: skip
    if outcome.oom_killed:
        return Classified(
            failed,
            _error(
                ErrorCategory.LIMIT_MEMORY,
                f"memory limit of {limits.memory_mb} MiB "
                "reached; the program was killed. Use less memory or raise "
                "policy.memory_mb",
                memory_mb=limits.memory_mb,
            ),
            sig,
        )
    if outcome.cpu_exhausted or sig == "SIGXCPU" or (sig == "SIGKILL" and _cpu_exhausted(outcome, limits)):
        return Classified(
            failed,
            _error(
                ErrorCategory.LIMIT_CPU,
                f"CPU-time limit of {limits.cpu_time_s} s reached; raise policy.cpu_time_s",
                cpu_time_s=limits.cpu_time_s,
            ),
            sig,
        )
    if sig == "SIGXFSZ":
        return Classified(failed, _disk_error(limits), sig)
    if outcome.exit_code == 0:
        return Classified(ExecutionStatus.SUCCEEDED, None, None)
    return Classified(failed, _program_error(outcome, language, limits, sig), sig)


def _cpu_exhausted(outcome: SandboxOutcome, limits: Limits) -> bool:
    # RLIMIT_CPU's hard limit ends in SIGKILL one second after the soft SIGXCPU was ignored.
    return outcome.run_ms / 1000 >= limits.cpu_time_s / max(limits.cpu, 1.0)


def _disk_error(limits: Limits) -> ExecutionError:
    return _error(
        ErrorCategory.LIMIT_DISK,
        f"writable space or file size limit of {limits.disk_mb} MiB exhausted; write less, or raise policy.disk_mb",
        disk_mb=limits.disk_mb,
    )


def _pids_error(limits: Limits) -> ExecutionError:
    return _error(
        ErrorCategory.LIMIT_PIDS,
        f"process/thread limit of {limits.pids} reached (a new process or "
        "thread could not start); use fewer, or raise policy.pids",
        pids=limits.pids,
    )


def _program_error(
    outcome: SandboxOutcome, language: str | ErrorRules, limits: Limits, sig: str | None
) -> ExecutionError:
    rules = language if isinstance(language, ErrorRules) else ErrorRules(language)
    language = rules.family
    stderr = outcome.stderr.decode("utf-8", "replace")
    parsed = _parse_exception(stderr, rules)
    tail = stderr[-2000:]
    if parsed is not None and parsed[2]:
        return _error(
            ErrorCategory.CODE_SYNTAX,
            f"the code does not compile: {parsed[0]}: {parsed[1]}",
            type=parsed[0],
            message=parsed[1],
            traceback=tail,
        )
    if language == "bash" and outcome.exit_code == 2 and "syntax error" in stderr:
        return _error(
            ErrorCategory.CODE_SYNTAX,
            "the script does not parse: " + stderr.strip()[-500:],
            message=stderr.strip()[-500:],
        )
    # A failed fork/thread start or a full disk usually surfaces as an ordinary error report;
    # the interpreters' wording is the only signal the engine does not give us.
    if _mentions(stderr, _PIDS_PATTERNS):
        return _pids_error(limits)
    if _mentions(stderr, _DISK_PATTERNS):
        return _disk_error(limits)
    if parsed is not None:
        exc_type, exc_msg, _ = parsed
        return _error(
            ErrorCategory.CODE_EXCEPTION,
            f"uncaught {exc_type}: {exc_msg}",
            type=exc_type,
            message=exc_msg,
            traceback=tail,
        )
    what = f"killed by {sig}" if sig else f"exited with code {outcome.exit_code}"
    return _error(ErrorCategory.CODE_EXIT_NONZERO, f"the program {what}", exit_code=outcome.exit_code, signal=sig)


def _mentions(stderr: str, patterns: tuple[re.Pattern[str], ...]) -> bool:
    return any(p.search(stderr) for p in patterns)


def _parse_exception(stderr: str, rules: ErrorRules) -> tuple[str, str, bool] | None:
    """(type, message, is_syntax) of an uncaught exception, read from the interpreter's report."""
    for pattern in rules.syntax:  # the language's own metadata first
        found = pattern.search(stderr)
        if found:
            line = stderr[found.start() :].splitlines()[0].strip()
            return "SyntaxError", line, True
    if rules.exception is not None:
        found = rules.exception.search(stderr)
        if found:
            groups = found.groupdict()
            return groups.get("type") or "Error", (groups.get("msg") or "").strip(), False
    language = rules.family
    lines = [line for line in stderr.splitlines() if line.strip()]
    if language == "python":
        # "Cell In[n]" (IPython 9; "Cell In [n]" in 8): IPython's report in a session.
        if not lines or not any(
            mark in stderr for mark in ("Traceback (most recent call last):", 'File "', "Cell In [", "Cell In[")
        ):
            return None
        match = _PY_EXC.match(lines[-1])
        if match is None or match.group("msg") is None and not match.group("type")[0].isupper():
            return None
        exc_type = match.group("type")
        return exc_type, match.group("msg") or "", exc_type.split(".")[-1] in _PY_SYNTAX
    if language == "javascript":
        for line in lines:
            match = _JS_EXC.match(line)
            if match:
                return match.group("type"), match.group("msg"), match.group("type") == "SyntaxError"
    return None
