"""A parsed spec file: its path and the line of every key, to locate errors (``FILE:LINE: field: message``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modak.errors import InputError

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecDocument:
    """A parsed spec file: where it is and the line of every key, for error messages."""

    path: Path
    lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """Line of ``loc``, or of its nearest ancestor present in the file."""
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None

    def error(self, loc: Loc | str, message: str) -> InputError:
        """An :class:`InputError` located at ``loc`` (a tuple or a dotted path)."""
        if isinstance(loc, str):
            loc = tuple(int(p) if p.isdigit() else p for p in loc.split(".")) if loc else ()
        return InputError(message, self.path, self.line_of(loc), dotted(loc) or None)

    def resolve(self, relative: str) -> Path:
        """A path written in this file, resolved against the file's folder."""
        return (self.path.parent / Path(relative).expanduser()).resolve()


def dotted(loc: Loc) -> str:
    """``loc`` as a dotted field path (``entrypoint.files.1``)."""
    return ".".join(str(p) for p in loc)
