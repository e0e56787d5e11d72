"""ONNX exports of the model zoo (host side): what the analysis reads and ONNX runtimes run.

Exports are cached under ``modak.paths.cache_dir() / "zoo"``, one folder per (name, input shapes, torch version,
the zoo's code), as a small graph-only ``.onnx`` file with its weights in a ``.onnx.data`` file beside it, so that
the analysis reads only the graph. The architectures themselves are in-image code: :mod:`modak.image.zoo`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modak.errors import InputError, ModakError, short_reason
from modak.image import zoo as image_zoo
from modak.image.zoo import SEED, ZooEntry, get_entry, make_inputs
from modak.paths import cache_dir, installed

OPSET = 17
# onnxruntime 1.31 reads IR versions up to 13 while onnx 1.23 writes 14; opset 17 needs only IR 8.
IR_VERSION = 10
_EXPORT_BATCH = 2  # traced with a batch of 2 so that no size-1 dimension is mistaken for a constant


def _zoo_source_digest() -> str:
    """The digest of the zoo's code (entries, architectures, initialization; read, not imported, so that torch is
    not): a changed architecture is another export."""
    zoo_py = Path(image_zoo.__file__ or "")
    return hashlib.sha256(zoo_py.read_bytes() + zoo_py.with_name("zoo_models.py").read_bytes()).hexdigest()[:16]


def export_path(name: str, input_shapes: Mapping[str, Any] | None = None) -> Path:
    """Where the export of ``name`` at ``input_shapes`` is cached (it may not exist yet)."""
    shapes = get_entry(name).shapes(input_shapes)
    torch_version = installed().version("torch")
    if torch_version is None:
        raise ModakError("the model zoo needs PyTorch: pip install 'modak[torch]'")
    key = json.dumps({"name": name, "shapes": {k: list(v) for k, v in shapes.items()}, "torch": torch_version,
                      "zoo": _zoo_source_digest(), "opset": OPSET, "ir": IR_VERSION}, sort_keys=True)
    return cache_dir() / "zoo" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}" / f"{name}.onnx"


def export_onnx(name: str, input_shapes: Mapping[str, Any] | None = None) -> Path:
    """The cached ONNX export of ``name`` (exported on first use): opset 17, dim 0 of every input and
    output is the symbolic ``batch``, IR version 10, weights in ``<name>.onnx.data`` beside the graph.

    A cached export is found without importing torch (its version comes from the package metadata).
    """
    entry = get_entry(name)
    shapes = entry.shapes(input_shapes)
    path = export_path(name, input_shapes)
    if path.is_file():
        return path
    folder = path.parent
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
        # torch annotates f as a path; its TorchScript exporter (dynamo=False) writes to a file object as well
        torch.onnx.export(model, tuple(inputs.values()), buffer,  # type: ignore[arg-type]
                          input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in [*names, "output"]}, opset_version=OPSET,
                          dynamo=False, training=torch.onnx.TrainingMode.PRESERVE)
    proto = onnx.load_from_string(buffer.getvalue())
    proto.ir_version = IR_VERSION
    proto.doc_string = f"modak zoo model '{entry.name}', random weights (seed {SEED})"
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
