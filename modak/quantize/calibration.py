"""The samples int8 quantization calibrates on and the accuracy gate compares int8 with fp32 on.

A job's ``calibration.data`` names a folder of sample inputs, read in file-name order until ``calibration.samples``
samples are taken:

* ``NAME.npz``: one array per input name of the model (``numpy.savez``);
* ``NAME.npy``: the one input of a single-input model (``numpy.save``).

An array is one sample (the input's per-sample shape, as ``model.input_shape`` gives it) or a stack of samples
(``[n, *shape]``); the inputs of one file hold the same number of samples. Arrays are read without pickles and
cast to the model's dtypes where NumPy casts them safely within their kind (float64 to float32, int32 to int64).
Anything else is an input error naming the file and the input (exit 2). Without a folder, the samples are seeded
random inputs (standard-normal floats, in-range integer ids), and the plan says what the accuracy figure then
means.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modak.image.runtimes.base import RunRequest, make_inputs
from modak.spec.loader import LoadedJob
from modak.workload.source import ModelSource

RANDOM_SEED = 0
_FIELD = ("calibration", "data")


@dataclass(frozen=True)
class Samples:
    """Calibration samples as batches of the job's batch size (the last one padded by repeating its last sample)."""

    batches: tuple[dict[str, np.ndarray], ...]
    count: int  # real samples (without the padding)
    folder: Path | None  # where they came from; None: seeded random inputs
    digest: str  # sha256 of the samples and the batch size

    def describe(self) -> str:
        """``64 random samples`` or ``64 samples from calibration.data``."""
        return f"{self.count} random samples" if self.folder is None else f"{self.count} samples from calibration.data"


def load_samples(loaded: LoadedJob, source: ModelSource) -> Samples:
    """The job's calibration samples (its folder's, else seeded random ones); bad files are located input errors."""
    wanted, batch = loaded.job.calibration.samples, loaded.job.model.batch_size
    assert isinstance(batch, int)  # a planned job's: the plan resolved 'auto' (modak.batching.with_batch)
    specs = _input_specs(source)
    folder = loaded.files.calibration
    if folder is None:
        request = RunRequest(runtime="onnxruntime", device="cpu", precision="fp32", params={}, threads=None,
                             task="inference", onnx_path=str(source.onnx_path), zoo=source.zoo, batch_size=wanted,
                             input_shapes=source.input_shapes, workdir="", seed=RANDOM_SEED)
        arrays = make_inputs(request)
    else:
        arrays = _read_folder(loaded, folder, specs, wanted)
    count = len(next(iter(arrays.values())))
    digest = hashlib.sha256(str(batch).encode())
    for name in sorted(arrays):
        digest.update(f"{name}:{arrays[name].dtype}:{arrays[name].shape}".encode())
        digest.update(np.ascontiguousarray(arrays[name]).tobytes())
    batches = []
    for start in range(0, count, batch):
        part = {name: a[start:start + batch] for name, a in arrays.items()}
        taken = len(next(iter(part.values())))
        batches.append({name: np.concatenate([a, np.repeat(a[-1:], batch - taken, axis=0)]) if taken < batch else a
                        for name, a in part.items()})
    return Samples(tuple(batches), count, folder, digest.hexdigest())


def _input_specs(source: ModelSource) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Input name -> (per-sample shape, dtype) of the model's graph."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    assert source.onnx_path is not None  # int8 quantizes the ONNX graph: its candidates are pruned without one
    graph = onnx.load(source.onnx_path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return {v.name: (tuple(source.input_shapes[v.name]),
                     np.dtype(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))
            for v in graph.input if v.name not in initializers}


def _read_folder(loaded: LoadedJob, folder: Path, specs: dict[str, tuple[tuple[int, ...], np.dtype]],
                 wanted: int) -> dict[str, np.ndarray]:
    """The first ``wanted`` samples of the folder's files, checked against the model's inputs."""
    doc = loaded.job_doc
    files = sorted(p for p in folder.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise doc.error(_FIELD, f"no .npz or .npy files in {folder}")
    parts: dict[str, list[np.ndarray]] = {name: [] for name in specs}
    taken = 0
    for path in files:
        if taken >= wanted:
            break
        arrays = _read_file(loaded, path, list(specs))
        missing, unknown = sorted(set(specs) - set(arrays)), sorted(set(arrays) - set(specs))
        if missing or unknown:
            raise doc.error(_FIELD, f"{path.name}: the model's inputs are {', '.join(specs)}"
                                    + (f"; missing {', '.join(missing)}" if missing else "")
                                    + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        counts = set()
        for name, array in arrays.items():
            shape, dtype = specs[name]
            if not np.can_cast(array.dtype, dtype, "same_kind"):
                raise doc.error(_FIELD, f"{path.name}: input {name}: dtype {array.dtype} cannot be converted to the "
                                        f"model's {dtype}")
            if tuple(array.shape) == shape:
                array = array[None]
            elif tuple(array.shape[1:]) != shape or len(array) == 0:
                raise doc.error(_FIELD, f"{path.name}: input {name}: shape {list(array.shape)} is neither one sample "
                                        f"{list(shape)} nor a stack of samples [n, {', '.join(map(str, shape))}]")
            arrays[name] = array.astype(dtype, copy=False)
            counts.add(len(array))
        if len(counts) != 1:
            raise doc.error(_FIELD, f"{path.name}: the inputs hold different numbers of samples "
                                    f"({ {n: len(a) for n, a in arrays.items()} })")
        take = min(counts.pop(), wanted - taken)
        for name, array in arrays.items():
            parts[name].append(array[:take])
        taken += take
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def _read_file(loaded: LoadedJob, path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays of one ``.npz`` (by name) or ``.npy`` (the single input) file, read without pickles."""
    try:
        if path.suffix == ".npy":
            if len(names) != 1:
                raise loaded.job_doc.error(_FIELD, f"{path.name}: a .npy file holds one input, and the model has "
                                                   f"{len(names)} ({', '.join(names)}): use .npz files")
            return {names[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError) as exc:
        raise loaded.job_doc.error(_FIELD, f"{path.name}: not a NumPy file modak can read ({exc})") from None
