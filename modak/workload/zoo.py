"""The model zoo: reference architectures defined in code with seeded random weights (nothing is downloaded).

Importing this module does not import torch; building, feeding or exporting a model does. Exports are cached
under ``modak.paths.cache_dir() / "zoo"``, one folder per (name, input shapes, torch version, ZOO_VERSION),
as a small graph-only ``.onnx`` file with its weights in a ``.onnx.data`` file beside it, so that the
analysis reads only the graph.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.errors import InputError, ModakError
from modak.paths import cache_dir
from modak.spec.models import Task
from modak.workload.analysis import short_reason, suggestion

if TYPE_CHECKING:
    import torch

# Bump when an architecture, its initialization or the export settings change: it invalidates cached exports.
ZOO_VERSION = 2
OPSET = 17
# onnxruntime 1.31 reads IR versions up to 13 while onnx 1.23 writes 14; opset 17 needs only IR 8.
IR_VERSION = 10
SEED = 0
_EXPORT_BATCH = 2  # traced with a batch of 2 so that no size-1 dimension is mistaken for a constant
_BOTH = (Task.training, Task.inference)


@dataclass(frozen=True)
class ZooEntry:
    """One zoo architecture: its inputs (per-sample shapes, dtypes, index ranges) and how to build it."""

    name: str
    description: str
    input_shapes: Mapping[str, tuple[int, ...]]
    input_dtypes: Mapping[str, str]
    tasks: tuple[Task, ...]
    factory: str  # function in modak.workload.zoo_models
    index_bounds: Mapping[str, int] | None = None  # exclusive upper bound of integer inputs (vocabulary, rows)

    def shapes(self, overrides: Mapping[str, Any] | None = None) -> dict[str, tuple[int, ...]]:
        """The default input shapes with ``overrides`` applied; names and ranks are checked."""
        shapes = dict(self.input_shapes)
        for key, shape in (overrides or {}).items():
            if key not in shapes:
                raise InputError(f"zoo model '{self.name}' has no input '{key}'{suggestion(key, shapes)}")
            shape = tuple(int(d) for d in shape)
            if len(shape) != len(shapes[key]) or min(shape, default=1) < 1:
                raise InputError(f"input '{key}' of zoo model '{self.name}' takes a per-sample shape of "
                                 f"{len(shapes[key])} positive dimensions like {list(shapes[key])}, got {list(shape)}")
            shapes[key] = shape
        return shapes

    def build(self, input_shapes: Mapping[str, Any] | None = None) -> torch.nn.Module:
        """The module with seeded random weights, in eval mode, sized for ``input_shapes``."""
        import torch

        from modak.workload import zoo_models

        shapes = self.shapes(input_shapes)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            try:
                model = zoo_models.build(self.factory, shapes)
            except ValueError as exc:
                raise InputError(f"zoo model '{self.name}': {exc}") from None
        return model.eval()


ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("mnist_cnn", "Small CNN for 28x28 digits: 2 conv + max-pool, 2 fully connected (0.4 M params)",
             {"input": (1, 28, 28)}, {"input": "float32"}, _BOTH, "mnist_cnn"),
    ZooEntry("mlp", "3-layer perceptron 784-1024-1024-10 (1.9 M params)",
             {"input": (784,)}, {"input": "float32"}, _BOTH, "mlp"),
    ZooEntry("resnet18", "ResNet-18 image classifier, 1000 classes (11.7 M params, 1.8 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "resnet18"),
    ZooEntry("resnet50", "ResNet-50 v1.5 image classifier, 1000 classes (25.6 M params, 4.1 GMAC at 224x224)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "resnet50"),
    ZooEntry("mobilenet_v2", "MobileNetV2 (width 1.0) image classifier, 1000 classes (3.5 M params, 0.3 GMAC)",
             {"input": (3, 224, 224)}, {"input": "float32"}, _BOTH, "mobilenet_v2"),
    ZooEntry("bert_base", "BERT-base encoder (12 layers, hidden 768) with a 2-class head; input: token ids "
             "(110 M params, 11.2 GMAC at sequence length 128)",
             {"input_ids": (128,)}, {"input_ids": "int64"}, _BOTH, "bert_base", {"input_ids": 30522}),
    ZooEntry("yolo_small", "Small YOLO-style detector: CSP backbone, SPPF, PAN neck, 3-scale head, 80 classes "
             "(1.9 M params)", {"input": (3, 320, 320)}, {"input": "float32"}, _BOTH, "yolo_small"),
    ZooEntry("dlrm_small", "Small DLRM recommender: 13 dense features, 26 embedding tables of 10k x 64, dot "
             "interaction, 1 logit (17 M params)", {"dense": (13,), "sparse": (26,)},
             {"dense": "float32", "sparse": "int64"}, _BOTH, "dlrm_small", {"sparse": 10_000}),
)}


def zoo_names() -> list[str]:
    """The zoo's architecture names, sorted."""
    return sorted(ZOO)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry ``name``; an unknown name is an :class:`InputError` with the closest match."""
    try:
        return ZOO[name]
    except KeyError:
        raise InputError(f"unknown zoo model '{name}'{suggestion(name, ZOO)}") from None


def make_inputs(name: str, batch: int = 1, shapes: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Seeded random inputs for ``name`` with a leading batch dimension, keyed by input name in call order.

    Floating-point inputs are standard normal; integer inputs (token ids, embedding indices) are uniform
    over their valid range.
    """
    import torch

    entry = get_entry(name)
    generator = torch.Generator().manual_seed(SEED + 1)
    inputs = {}
    for key, shape in entry.shapes(shapes).items():
        size = (batch, *shape)
        if entry.input_dtypes[key] == "int64":
            inputs[key] = torch.randint(0, (entry.index_bounds or {})[key], size, generator=generator)
        else:
            inputs[key] = torch.randn(size, generator=generator, dtype=getattr(torch, entry.input_dtypes[key]))
    return inputs


def export_onnx(name: str, input_shapes: Mapping[str, Any] | None = None) -> Path:
    """The cached ONNX export of ``name`` (exported on first use): opset 17, dim 0 of every input and
    output is the symbolic ``batch``, IR version 10, weights in ``<name>.onnx.data`` beside the graph.

    A cached export is found without importing torch (its version comes from the package metadata).
    """
    entry = get_entry(name)
    shapes = entry.shapes(input_shapes)
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise ModakError("the model zoo needs PyTorch: pip install 'modak[torch]'") from None
    key = json.dumps({"name": name, "shapes": {k: list(v) for k, v in shapes.items()}, "torch": torch_version,
                      "zoo": ZOO_VERSION, "opset": OPSET, "ir": IR_VERSION}, sort_keys=True)
    folder = cache_dir() / "zoo" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    path = folder / f"{name}.onnx"
    if path.is_file():
        return path
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        try:
            _export(entry, shapes, staging / path.name)
        except RuntimeError as exc:  # the network cannot run on these shapes
            wanted = {k: list(v) for k, v in shapes.items()}
            raise InputError(f"zoo model '{name}' cannot be exported for input shapes {wanted}: "
                             f"{short_reason(exc)}") from None
        try:
            os.rename(staging, folder)  # atomic: readers see the whole folder or none
        except OSError:
            if not path.is_file():  # not a concurrent export that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _export(entry: ZooEntry, shapes: dict[str, tuple[int, ...]], path: Path) -> None:
    import io

    import onnx
    import torch

    model = entry.build(shapes)
    inputs = make_inputs(entry.name, _EXPORT_BATCH, shapes)
    names = list(inputs)
    buffer = io.BytesIO()
    # PRESERVE keeps BatchNormalization nodes (EVAL would fold them into the convolutions) so that the graph
    # shows the architecture; the model is in eval mode, so they are exported in inference form.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(model, tuple(inputs.values()), buffer, input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in [*names, "output"]}, opset_version=OPSET,
                          dynamo=False, training=torch.onnx.TrainingMode.PRESERVE)
    proto = onnx.load_from_string(buffer.getvalue())
    proto.ir_version = IR_VERSION
    proto.doc_string = f"modak zoo model '{entry.name}' (ZOO_VERSION {ZOO_VERSION}), random weights (seed {SEED})"
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
