"""Post-training int8 quantization of the job's ONNX model and the accuracy gate, both cached.

Methods (a runtime recipe's ``quantization`` parameter), each producing one QDQ ONNX file:

* ``static`` (ONNX Runtime): ``quantize_static`` with the calibration samples, QDQ format, per-channel int8
  weights, uint8 activations with MinMax ranges;
* ``dynamic`` (ONNX Runtime): ``quantize_dynamic``, int8 weights, activation ranges computed per batch at run time;
* ``nncf`` (OpenVINO): ``nncf.quantize`` of the ONNX model on the calibration samples (ONNX backend).

The gate runs the fp32 model (ONNX Runtime) and the quantized one on the same samples, the quantized one with the
runtime that will run it (the candidate's runtime adapter, :mod:`modak.image.runtimes`), and records two figures:
the top-1 agreement (argmax of the first output per sample) and the relative error (max |int8 - fp32| / max |fp32|
over all outputs). The quantized file and its figures live in ``cache_dir()/quantized/<key>/`` where the key
covers the ONNX file's content (with its external data), the runtime, the method and its settings, the samples and
the library versions: a later plan, bench or build reuses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from modak.documents.plan import Accuracy as AccuracyRecord
from modak.image.runtimes.base import RunRequest, adapter, relative_error
from modak.paths import cache_dir, write_atomic
from modak.quantize.calibration import Samples
from modak.spec.models import Accuracy, AccuracyMetric
from modak.workload.source import ModelSource

FORMAT = 1  # of the cache folder; bump when the quantizers' settings or the figures change
MODEL_FILE = "model.onnx"
FIGURES_FILE = "figures.json"
DEFAULT_MAX_DROP = {AccuracyMetric.top1_agreement: 0.01, AccuracyMetric.relative_error: 0.1}
# Method -> (settings recorded in the key, the libraries whose versions the result depends on).
SETTINGS: dict[str, dict[str, Any]] = {
    "static": {"format": "QDQ", "per_channel": True, "weights": "int8", "activations": "uint8", "calibrate": "MinMax"},
    "dynamic": {"weights": "int8", "per_channel": False},
    "nncf": {"backend": "onnx", "preset": "performance", "fast_bias_correction": True},
}
_LIBRARIES = {"static": ("onnx", "onnxruntime"), "dynamic": ("onnx", "onnxruntime"),
              "nncf": ("onnx", "onnxruntime", "nncf", "openvino")}


@dataclass(frozen=True)
class AccuracyCheck:
    """The gate's verdict on one quantization method for a job: its figure against the job's tolerance."""

    runtime: str
    method: str
    metric: AccuracyMetric
    value: float  # top-1 agreement, or relative error
    max_drop: float
    samples: str  # ``64 random samples``, ``64 samples from calibration.data``
    random_samples: bool
    model: Path  # the quantized ONNX file (cached)
    key: str  # the cache key naming it

    @property
    def drop(self) -> float:
        """1 - agreement, or the relative error."""
        return 1.0 - self.value if self.metric is AccuracyMetric.top1_agreement else self.value

    @property
    def passed(self) -> bool:
        return self.drop <= self.max_drop

    def figure(self) -> str:
        """``top-1 agreement 0.953 on 64 random samples``."""
        what = "top-1 agreement" if self.metric is AccuracyMetric.top1_agreement else "relative error"
        return f"{what} {self.value:.4g} with fp32 on {self.samples}"

    def verdict(self) -> str:
        """The figure against the tolerance, for the plan's reasons."""
        if self.metric is AccuracyMetric.top1_agreement:
            bound = f"{'at least' if self.passed else 'below'} {1 - self.max_drop:.4g}"
        else:
            bound = f"{'at most' if self.passed else 'above'} {self.max_drop:.4g}"
        return f"{self.figure()}, {bound} (accuracy.max_drop {self.max_drop:g})"

    def record(self) -> AccuracyRecord:
        """The plan's ``accuracy`` of a candidate (and the image's ``io.modak.quantized-model`` label)."""
        return AccuracyRecord(method=self.method, metric=self.metric.value,  # type: ignore[arg-type]
                              value=round(self.value, 6), drop=round(self.drop, 6), max_drop=self.max_drop,
                              passed=self.passed, samples=self.samples, random_samples=self.random_samples,
                              quantized_model=self.key)


def resolve_metric(accuracy: Accuracy, classifier: bool) -> tuple[AccuracyMetric, float]:
    """The job's metric and tolerance, with the defaults filled in (see :class:`modak.spec.models.Accuracy`)."""
    metric = accuracy.metric or (AccuracyMetric.top1_agreement if classifier else AccuracyMetric.relative_error)
    return metric, accuracy.max_drop if accuracy.max_drop is not None else DEFAULT_MAX_DROP[metric]


def check(source: ModelSource, runtime: str, method: str, samples: Samples, accuracy: Accuracy) -> AccuracyCheck:
    """Quantize ``source`` with ``method`` (or reuse the cached result) and hold its figure against ``accuracy``."""
    key = cache_key(source, runtime, method, samples)
    folder = cache_dir() / "quantized" / key
    try:
        figures = json.loads((folder / FIGURES_FILE).read_text())
        if not (folder / MODEL_FILE).is_file():
            raise OSError("no model")
    except (OSError, ValueError):
        figures = _quantize_and_measure(source, runtime, method, samples, folder)
    metric, max_drop = resolve_metric(accuracy, bool(figures["classifier"]))
    return AccuracyCheck(runtime, method, metric, float(figures[metric.value]), max_drop, samples.describe(),
                         samples.folder is None, folder / MODEL_FILE, key)


def cache_key(source: ModelSource, runtime: str, method: str, samples: Samples) -> str:
    """What a quantized model and its figures depend on, hashed: the ONNX file's content (and its external data),
    the runtime that measures the figures, the method and its settings, the samples, the library versions and this
    module's format."""
    digest = hashlib.sha256(json.dumps(
        {"format": FORMAT, "runtime": runtime, "method": method, "settings": SETTINGS[method],
         "samples": samples.digest, "versions": {name: _version(name) for name in _LIBRARIES[method]}},
        sort_keys=True).encode())
    assert source.onnx_path is not None  # int8 quantizes the ONNX graph: its candidates are pruned without one
    for path in (source.onnx_path, *(source.onnx_path.parent / name for name in source.data_files)):
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:32]


def _quantize_and_measure(source: ModelSource, runtime: str, method: str, samples: Samples,
                          folder: Path) -> dict[str, Any]:
    """Quantize into a fresh folder, measure the figures, then move the folder into place (a concurrent plan that
    finished first wins; its result is the same)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    assert source.onnx_path is not None  # int8 quantizes the ONNX graph: its candidates are pruned without one
    try:
        with _quiet():
            _QUANTIZERS[method](source.onnx_path, work / MODEL_FILE, samples)
            figures = _figures(source, runtime, work / MODEL_FILE, samples)
        write_atomic(work / FIGURES_FILE, json.dumps(figures, sort_keys=True))
        try:
            os.replace(work, folder)
        except OSError:  # another process put it there meanwhile
            pass
        return json.loads((folder / FIGURES_FILE).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _figures(source: ModelSource, runtime: str, quantized: Path, samples: Samples) -> dict[str, Any]:
    """fp32 (ONNX Runtime) and int8 (``runtime``) outputs on the samples, and both figures."""
    import onnxruntime as ort

    batch = len(next(iter(samples.batches[0].values())))
    reference = ort.InferenceSession(str(source.onnx_path), providers=["CPUExecutionProvider"])
    request = RunRequest(runtime=runtime, device="cpu", precision="int8", params={}, threads=None, task="inference",
                         onnx_path=str(quantized), zoo=source.zoo, batch_size=batch,
                         input_shapes=source.input_shapes, workdir=tempfile.gettempdir())
    session = adapter(runtime).prepare(request, dict(samples.batches[0]))
    fp32 = _concatenate([reference.run(None, dict(b)) for b in samples.batches], samples.count)
    int8 = _concatenate([session.run(b) for b in samples.batches], samples.count)
    first_fp32, first_int8 = (o.reshape(samples.count, -1) for o in (fp32[0], int8[0]))
    return {"classifier": first_fp32.shape[1] > 1,
            "top1_agreement": float(np.mean(first_fp32.argmax(axis=1) == first_int8.argmax(axis=1))),
            "relative_error": relative_error(int8, fp32)}


def _concatenate(runs: list[list[np.ndarray]], count: int) -> list[np.ndarray]:
    """Each output over all batches, without the padding."""
    return [np.concatenate([np.asarray(run[i]) for run in runs])[:count] for i in range(len(runs[0]))]


def _quantize_static(source: Path, target: Path, samples: Samples) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter(samples.batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)


def _quantize_dynamic(source: Path, target: Path, samples: Samples) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), per_channel=False, weight_type=QuantType.QInt8)


def _quantize_nncf(source: Path, target: Path, samples: Samples) -> None:
    import nncf
    import onnx

    quantized = nncf.quantize(onnx.load(str(source)), nncf.Dataset(list(samples.batches)),
                              preset=nncf.QuantizationPreset.PERFORMANCE, subset_size=len(samples.batches),
                              fast_bias_correction=True)
    onnx.save(quantized, str(target))


_QUANTIZERS: dict[str, Callable[[Path, Path, Samples], None]] = {
    "static": _quantize_static, "dynamic": _quantize_dynamic, "nncf": _quantize_nncf}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The quantizers' advice and progress bars go to stderr at most, never into stdout (``--json``)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        root.setLevel(level)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
