"""The job's pre- and post-processing (``model.tokenizer``, ``model.image_processor``, ``model.preprocess``,
``model.postprocess``) as the plan records it: what the image reads (:class:`modak.image.deployment.Deployment`'s
fields and the files beside the model file), and what it costs per batch, measured on this machine.

The measurement runs what the image runs (:mod:`modak.image.processing`) on the files staged as the image lays them
out, in a child process under the user's code limits (:func:`modak.workload.usercode.run_child`): the sample
items are pre-processed, the user's model runs on them (so that a pre-processing that does not fit the model is an
error at plan time, at the user's file and line) and its outputs are post-processed. Each is timed separately. The
figures are cached under ``modak.paths.cache_dir() / "processing"``, keyed by the files' digests and the batch, so
that later plans of the job say the same.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modak.documents import duration, rounded
from modak.documents.plan import Processing
from modak.paths import cache_dir, file_digest, folder_digest, write_atomic
from modak.spec.loader import LoadedJob
from modak.spec.resolve import beside, module_code

_CHILD = "modak.workload.processing_child"


@dataclass(frozen=True)
class ProcessingCost:
    """What the job's pre- and post-processing cost for one batch of ``items``, measured on this machine."""

    kind: str  # tokenizer | image_processor | function
    items: int  # the batch the figures are for
    preprocess_seconds: float
    postprocess_seconds: float | None  # None: no post-processing

    def record(self) -> Processing:
        """The plan's ``processing``."""
        return Processing(kind=self.kind, items=self.items,  # type: ignore[arg-type]
                          preprocess_seconds=self.preprocess_seconds, postprocess_seconds=self.postprocess_seconds,
                          measured_on="this machine")

    def describe(self) -> str:
        """One line for the plan's reasons."""
        post = f", post-processing {duration(self.postprocess_seconds)}" if self.postprocess_seconds else ""
        return (f"pre-processing ({self.kind.replace('_', ' ')}) {duration(self.preprocess_seconds)} per batch of "
                f"{self.items}{post}, measured here; not in the predicted step")


def deployment_fields(loaded: LoadedJob) -> dict[str, Any]:
    """The job's pre- and post-processing as the image reads them (:class:`Deployment`'s ``tokenizer``,
    ``image_processor``, ``preprocess``, ``postprocess``): names of the files beside the model file."""
    spec, files = loaded.job.model, loaded.files
    found: dict[str, Any] = {}
    if spec.tokenizer is not None and files.tokenizer is not None:
        found["tokenizer"] = {"folder": files.tokenizer.name, "max_length": spec.tokenizer.max_length}
    if files.image_processor is not None:
        found["image_processor"] = {"folder": files.image_processor.name}
    if spec.preprocess is not None and files.preprocess_example is not None:
        found["preprocess"] = {"function": beside(spec.preprocess.function), "example": files.preprocess_example.name}
    if spec.postprocess is not None:
        found["postprocess"] = beside(spec.postprocess)
    return found


def processing_files(loaded: LoadedJob) -> list[Path]:
    """The files of the job's pre- and post-processing, which every runtime's image carries beside the model file:
    the tokenizer's or image processor's folder, the example item, the functions' modules (or their top-level
    package folders)."""
    spec, files = loaded.job.model, loaded.files
    found = [path for path in (files.tokenizer, files.image_processor, files.preprocess_example) if path]
    for function, module in ((spec.preprocess.function if spec.preprocess else None, files.preprocess_module),
                             (spec.postprocess, files.postprocess_module)):
        if function is not None and module is not None:
            code = module_code(function.rpartition(":")[0], module)
            found += [code] if code not in found else []
    return found


def measure_processing(loaded: LoadedJob, batch: int) -> ProcessingCost | None:
    """The job's processing cost for a batch of ``batch`` items, from the cache or measured in the child; None
    without pre-processing. A failure is an :class:`~modak.errors.InputError` at the job's field."""
    fields = deployment_fields(loaded)
    if not fields:
        return None
    from modak.workload import processing_child
    from modak.workload.usercode import model_digests, run_child

    files = processing_files(loaded)
    key = hashlib.sha256(json.dumps({
        "fields": fields, "batch": batch, "model": model_digests(loaded),
        "files": {path.name: file_digest(path) if path.is_file() else folder_digest(path) for path in files},
        "child": file_digest(Path(processing_child.__file__)),
        "shapes": loaded.job.model.input_shape}, sort_keys=True).encode()).hexdigest()[:32]
    cached = cache_dir() / "processing" / f"{key}.json"
    if cached.is_file():
        return ProcessingCost(**json.loads(cached.read_text()))
    with tempfile.TemporaryDirectory(prefix="modak-processing-") as staged:
        for path in files:  # laid out as the image's model folder
            (Path(staged) / path.name).symlink_to(path)
        work = {"fields": fields, "folder": staged, "batch": batch}
        result = run_child(loaded, _CHILD, {processing_child.PROCESSING: work})
    cost = ProcessingCost(kind=result["kind"], items=batch, preprocess_seconds=rounded(result["preprocess_seconds"]),
                          postprocess_seconds=(rounded(result["postprocess_seconds"])
                                               if result["postprocess_seconds"] is not None else None))
    write_atomic(cached, json.dumps({"kind": cost.kind, "items": cost.items,
                                     "preprocess_seconds": cost.preprocess_seconds,
                                     "postprocess_seconds": cost.postprocess_seconds}))
    return cost

