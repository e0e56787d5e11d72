"""Predictions kept in modak's cache under everything they were made from, so that a warm plan neither loads the
fitted models nor reads the runtimes' kernel reports (a plan's predictions cost more than the rest of it).

An entry's key is the digest of the predictor's identity (:func:`identity`: the keys of the data its fits were fit
on, the catalog, the installed distributions' versions and modak's own source files), the model (its ONNX graph's
digest and zoo name), the workload, the target's ceilings and the candidates with their recipes. Unlike a fit, which
takes a minute and is keyed by its data alone (:mod:`modak.predict.fits`), predictions take milliseconds to make
again, so any change to modak's code makes them again. Predictions just made are written and read back before they
are used, so a plan is the same whether its predictions were made in this process or read.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import msgspec

from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings
from modak.paths import cache_dir, file_digest, installed, keep_newest, source_identity, write_atomic
from modak.predict.base import Prediction, PredictionRequest, Predictor, for_model, predict_many
from modak.workload.analysis import WorkloadProfile

FOLDER = "predictions"  # under modak's cache
KEEP = 256  # entries kept (the newest), each a few kilobytes
_DECODE = msgspec.json.Decoder(list[Prediction | None])


def identity(*parts: str | None, catalog: Mapping[str, Recipe]) -> str:
    """A predictor's identity: ``parts`` (the keys of what its fits were fit on), the ``catalog``, the installed
    distributions' versions (the runtimes that report kernels) and modak's source files
    (:func:`modak.paths.source_identity`)."""
    digest = hashlib.sha256(b"predictions 1")
    for part in parts:
        digest.update(b"\0" + (part or "-").encode())
    digest.update(_canonical([catalog, installed().versions]))
    digest.update(source_identity().encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class MemoPredictor:
    """The predictor ``make`` returns (its fits loaded only when a request is not remembered), its predictions kept
    under ``key`` (:func:`identity`) in modak's cache."""

    key: str
    make: Callable[[], Predictor]
    onnx_path: Path | None = None
    zoo: str | None = None

    @cached_property
    def made(self) -> Predictor:
        """The predictor itself, bound to the model."""
        return for_model(self.make(), self.onnx_path, self.zoo)

    @property
    def name(self) -> str:
        return self.made.name

    def for_model(self, onnx_path: Path | None, zoo: str | None = None) -> MemoPredictor:
        """This predictor for the model at ``onnx_path`` (zoo model ``zoo``; :func:`modak.predict.base.for_model`)."""
        return replace(self, onnx_path=onnx_path, zoo=zoo)

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        return self.predict_many(workload, ceilings, [(candidate, recipe)])[0]

    def predict_many(self, workload: WorkloadProfile, ceilings: TargetCeilings,
                     requests: Sequence[PredictionRequest]) -> list[Prediction | None]:
        """The remembered predictions of ``requests``, else the made predictor's (then remembered)."""
        try:
            entry = cache_dir() / FOLDER / f"{self._entry(workload, ceilings, requests)}.json"
        except OSError:  # the graph cannot be read: nothing to remember it by
            return predict_many(self.made, workload, ceilings, list(requests))
        with contextlib.suppress(OSError, msgspec.DecodeError):
            return _DECODE.decode(entry.read_bytes())
        made = msgspec.json.encode(predict_many(self.made, workload, ceilings, list(requests)))
        with contextlib.suppress(OSError):  # a cache that cannot be written (an image's read-only home)
            write_atomic(entry, made)
            keep_newest(entry.parent, "*.json", KEEP)
        return _DECODE.decode(made)

    def _entry(self, workload: WorkloadProfile, ceilings: TargetCeilings,
               requests: Sequence[PredictionRequest]) -> str:
        """The name of the requests' entry; raises OSError where the model's graph cannot be read."""
        graph = file_digest(self.onnx_path) if self.onnx_path is not None else "-"
        digest = hashlib.sha256(f"{self.key}\0{graph}\0{self.zoo}\0".encode())
        digest.update(_canonical([workload, ceilings, list(requests)]))
        return digest.hexdigest()[:32]


def _canonical(value: object) -> bytes:
    """``value`` as JSON bytes that are the same in every process: sets and mappings sorted, keys as strings."""
    return msgspec.json.encode(msgspec.to_builtins(value, str_keys=True, order="deterministic"))
