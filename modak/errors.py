"""Errors with documented exit codes; the CLI prints them as one line, never a traceback."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

# The exit codes of the modak command. Each constant's docstring is its documentation: the site's reference
# (docs/reference/limits.md) is generated from them. The image's commands (modak.runtime.cli) use 0, 2, 3, 130 and
# their own below.
EXIT_OK = 0
"""Success."""
EXIT_FAILURE = 1
"""Internal error: a bug in modak (``MODAK_DEBUG=1`` shows the traceback)."""
EXIT_BAD_INPUT = 2
"""Bad input: ``FILE:LINE: field.path: what is wrong`` on stderr, nothing written (also: a ``--store`` that is not
a perf store, an output folder another ``modak build`` is using, half of ``MODAK_REGISTRY_USERNAME``/``_PASSWORD``,
an input beyond a limit below)."""
EXIT_RUN_FAILED = 3
"""A measured candidate failed (``modak bench``, ``modak tune``); in the image: the model or its deployment
failed."""
EXIT_ENGINE_UNAVAILABLE = 4
"""No container engine to talk to (not running, not reachable, not installed): the message says how to start one."""
EXIT_BUILD_FAILED = 5
"""Build failed: the message names the failing step; the full log is in ``OUT_DIR/build.log``; no image is
tagged."""
EXIT_SMOKE_FAILED = 6
"""Smoke test failed: the built image's self-test printed no JSON, failed, or ran another runtime than the
plan's."""
EXIT_SUBMIT_FAILED = 7
"""Submission failed: the scheduler refused the job script (or is not installed)."""
EXIT_PUSH_FAILED = 8
"""Push failed: the registry refused the image, or pulling it back gave other labels."""
EXIT_REGRESSION = 9
"""``modak check``: the step time regressed beyond the threshold against the baseline."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C), reported with what was kept."""
EXIT_SOME_INPUTS_BAD = 4
"""In the image: ``modak run --keep-going`` found bad input files (the others done)."""
EXIT_CANNOT_EXECUTE = 127
"""In the image: the launcher could not start its command (the shell's code)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # written as escapes, so that an error stays one line


class ModakError(Exception):
    """Base for errors modak reports to the user as a single line."""

    exit_code = EXIT_FAILURE


class InputError(ModakError):
    """Bad input: ``FILE:LINE: field.path: what is wrong`` (exit code 2), one line: control characters in any
    part (a file name, a value quoted from the input) are written as escapes."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, file: str | Path | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        location = ""
        if self.file:
            location = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        field = f"{self.field}: " if self.field else ""
        return _CONTROL.sub(lambda m: repr(m[0])[1:-1], f"{location}{field}{self.message}")


class EngineUnavailable(ModakError):
    """The container engine cannot be reached or is not installed (exit code 4)."""

    exit_code = EXIT_ENGINE_UNAVAILABLE


class BuildFailed(ModakError):
    """A build step failed: names the step and where the full log is (exit code 5)."""

    exit_code = EXIT_BUILD_FAILED

    def __init__(self, message: str, step: str | None = None, log: Path | None = None) -> None:
        self.step = step
        self.log = log
        super().__init__(message)


class SmokeTestFailed(ModakError):
    """The image's self-test did not print the expected JSON (exit code 6)."""

    exit_code = EXIT_SMOKE_FAILED


class SubmitFailed(ModakError):
    """The scheduler did not accept the job script (exit code 7)."""

    exit_code = EXIT_SUBMIT_FAILED


class PushFailed(ModakError):
    """Pushing the image (or pulling it back) failed (exit code 8)."""

    exit_code = EXIT_PUSH_FAILED


class Interrupted(ModakError):
    """Ctrl-C during a long step, reported with what was kept (exit code 130)."""

    exit_code = EXIT_INTERRUPTED


def did_you_mean(name: str, known: Iterable[object], cutoff: float = 0.5, list_known: bool = True) -> str:
    """``"; did you mean 'X'?"`` for the closest of ``known`` (ignoring case), else the list of them (unless
    ``list_known`` is false, or there are none). The one suggestion helper of every "unknown name" message."""
    by_lower = {str(k).lower(): str(k) for k in known}
    import difflib

    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=cutoff)
    if close:
        return f"; did you mean '{by_lower[close[0]]}'?"
    return f" (known: {', '.join(sorted(by_lower.values()))})" if by_lower and list_known else ""


def short_reason(exc: BaseException) -> str:
    """The first line of an exception's message, at most 200 characters."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
