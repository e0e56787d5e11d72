"""A parsed spec file: its path and the line of every key, to locate errors (``FILE:LINE: field: message``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modak.errors import InputError
from modak.paths import refusal

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecDocument:
    """A parsed spec file: where it is and the line of every key, for error messages; a target's says whether it
    describes the machine modak runs on (``target: local``, or ``cpu: local`` in the file)."""

    path: Path
    lines: dict[Loc, int] = field(default_factory=dict)
    local: bool = False

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

    def resolve(self, relative: str, loc: Loc) -> Path:
        """The path at ``loc`` in this file, resolved against the file's folder. A path the operating system
        refuses (:func:`modak.paths.refusal`) is an error located at ``loc``; a missing one is left to the caller,
        which knows what should be there."""
        try:
            path = self.path.parent / Path(relative).expanduser()
            reason = refusal(path)
            if reason is None:
                return path.resolve()
        except RuntimeError as exc:  # an unknown ~user
            reason = str(exc)
        raise self.error(loc, f"cannot use this path: {reason}")


def dotted(loc: Loc) -> str:
    """``loc`` as a dotted field path (``entrypoint.files.1``)."""
    return ".".join(str(p) for p in loc)
