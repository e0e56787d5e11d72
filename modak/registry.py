"""Named implementations of an extension point (schedulers, container engines), registered beside their code.

A module registers what it implements with the decorator (``@SCHEDULERS.register("slurm")``); its package imports
the module, so the registry is complete once the package is. Code outside modak, and tests, add one for a while
with :meth:`Registry.registered`, which takes it out again on leaving, so nothing leaks into later work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from modak.errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
    """Implementations of one extension point by name, in the order they were registered."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # what an entry is, for messages ("scheduler", "container engine")
        self._entries: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """A decorator registering what it decorates under ``names``; a name registered before is an error."""
        def add(entry: T) -> T:
            for name in names:
                if name in self._entries:
                    raise ValueError(f"{self.kind} {name!r} is registered already")
                self._entries[name] = entry
            return entry
        return add

    @contextmanager
    def registered(self, name: str, entry: T) -> Iterator[T]:
        """``entry`` registered as ``name`` inside the ``with`` block only."""
        self.register(name)(entry)
        try:
            yield entry
        finally:
            del self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name is an :class:`~modak.errors.InputError` listing the known ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise InputError(f"unknown {self.kind} {name!r} (one of {', '.join(self._entries)})") from None
