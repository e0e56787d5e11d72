"""A candidate deployment: a runtime on a device at a precision with concrete parameter values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from modak.spec.models import Precision

DeviceKind = Literal["cpu", "gpu"]
ParamValue = bool | int | str


def value_key(value: ParamValue) -> str:
    """How a parameter value is written as a key in a recipe (``true``/``false`` for booleans)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Candidate:
    """One deployment: a runtime on a device at a precision with concrete parameter values.

    ``params`` keep symbolic thread values (``all``, ``half``); ``threads`` is their value on the target's
    cores, used for prediction (the entrypoint recomputes it from the real allocation).
    """

    runtime: str
    device: DeviceKind
    precision: Precision
    params: tuple[tuple[str, ParamValue], ...]
    threads: int | None

    @property
    def name(self) -> str:
        settings = " ".join(f"{k}={value_key(v)}" for k, v in self.params)
        return f"{self.runtime}/{self.device}/{self.precision.value}" + (f" {settings}" if settings else "")

    def param(self, name: str, default: ParamValue | None = None) -> ParamValue | None:
        return dict(self.params).get(name, default)
