"""The child process that measures the job's pre- and post-processing for
:func:`modak.workload.processing.measure_processing` (``python -m modak.workload.processing_child FOLDER``).

Started through :func:`modak.workload.usercode.run_child`, under the user's code limits: it loads the processing
as the image does (:mod:`modak.image.processing`) from the staged folder, times the pre-processing of a batch of
sample items, runs the user's model on what it made (:func:`modak.workload.usercode_child.load`) and times the
post-processing of the outputs. Nothing here is imported by the planner.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modak.workload import usercode_child
from modak.workload.usercode_child import UserCodeError

PROCESSING = "processing"  # the child request's key of this work
_MIN_SECONDS = 0.2  # time each step at least this long, in repeats
_MAX_REPEATS = 50


def measure(request: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The median seconds of the pre- and post-processing of one batch, checked against the model."""
    import numpy as np
    import torch

    from modak.image.calling import by_keyword, call_model, flatten
    from modak.image.deployment import Deployment
    from modak.image.processing import load_postprocessor, load_preprocessor, sample_items
    from modak.spec.models import input_types

    work = request[PROCESSING]
    staged, fields, batch = Path(work["folder"]), work["fields"], int(work["batch"])
    shapes = request["input_shapes"]
    deployment = Deployment(runtime="", device="cpu", precision="fp32", task="inference", params={}, env={},
                            batch_size=batch, input_shapes=shapes, **fields)
    pre_field, kind = _pre_field(fields)
    root = staged  # the user's functions are imported from their links there
    usercode_child.set_phase(folder, pre_field)
    try:
        preprocessor = load_preprocessor(deployment, staged, list(shapes))
        postprocessor = load_postprocessor(deployment, staged)
        samples = sample_items(deployment, staged)
    except Exception as exc:
        raise UserCodeError(pre_field, f"cannot load it: {usercode_child.describe(exc)}", exc, root) from exc
    assert preprocessor is not None
    items = (samples * batch)[:batch]
    types = input_types(request.get("input_dtype"), request.get("input_high"), list(shapes))
    dtypes = {name: np.dtype(types[name][0]) for name in shapes}
    feeds, pre_s = _timed(lambda: preprocessor.encode(items, dtypes), pre_field, root)
    wrong = [f"{name} {list(np.shape(feeds[name]))}" for name in shapes
             if list(np.shape(feeds[name])) != [batch, *shapes[name]]]
    if wrong:
        takes = ", ".join(f"{name} {[batch, *shape]}" for name, shape in shapes.items())
        raise UserCodeError(pre_field, f"it made {', '.join(wrong)} of {batch} items; the model takes {takes}")
    post_s = None
    if postprocessor is not None:
        model, _ = usercode_child.load(request, folder)
        names = list(shapes)
        usercode_child.set_phase(folder, "model.input_shape")
        with torch.no_grad():
            tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in names]
            outputs = flatten(call_model(model, names, tensors, by_keyword(model, names)))
        arrays = {name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
                  for name, tensor in zip(outputs.names, outputs.tensors)}
        usercode_child.set_phase(folder, "model.postprocess")
        _, post_s = _timed(lambda: postprocessor.decode(arrays, batch), "model.postprocess", root)
    return {"ok": True, "kind": kind, "preprocess_seconds": pre_s, "postprocess_seconds": post_s}


def _pre_field(fields: dict[str, Any]) -> tuple[str, str]:
    """The job field of the pre-processing, and its kind."""
    if "tokenizer" in fields:
        return "model.tokenizer.path", "tokenizer"
    if "image_processor" in fields:
        return "model.image_processor.path", "image_processor"
    return "model.preprocess.function", "function"


def _timed(step: Callable[[], Any], field: str, root: Path) -> tuple[Any, float]:
    """What ``step`` returns, and its median seconds over repeats (at least :data:`_MIN_SECONDS` in all); its
    failure is the user's error at ``field``."""
    seconds: list[float] = []
    result = None
    try:
        while len(seconds) < 3 or sum(seconds) < _MIN_SECONDS and len(seconds) < _MAX_REPEATS:
            start = time.perf_counter()
            result = step()
            seconds.append(time.perf_counter() - start)
    except Exception as exc:
        raise UserCodeError(field, usercode_child.describe(exc), exc, root) from exc
    return result, statistics.median(seconds[1:])  # the first warms caches and imports


if __name__ == "__main__":
    sys.exit(usercode_child.main(sys.argv, measure))
