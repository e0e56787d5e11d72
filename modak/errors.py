"""Errors with documented exit codes; the CLI prints them as one line, never a traceback."""

from __future__ import annotations

from pathlib import Path

# Documented exit codes (README, "Exit codes").
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class ModakError(Exception):
    """Base for errors modak reports to the user as a single line."""

    exit_code = EXIT_FAILURE


class InputError(ModakError):
    """Bad input: ``FILE:LINE: field.path: what is wrong`` (exit code 2)."""

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
        return f"{location}{field}{self.message}"
