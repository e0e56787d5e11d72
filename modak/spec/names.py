"""The names of what a spec chooses among and a higher layer implements: the one home of the container engines'
names (:mod:`modak.build.engines` registers an implementation of each; tests/test_registries.py checks that it
registers exactly these). Light to import: the command line's choices come from here too. Schedulers need no list
here: their registry, :data:`modak.schedulers.SCHEDULERS`, is below the spec."""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["docker", "podman", "apptainer"]  # a target's container.engine
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
