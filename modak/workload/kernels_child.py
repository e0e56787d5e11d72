"""The child process that traces the user's own model for :func:`modak.workload.kernels.planned_kernels`
(``python -m modak.workload.kernels_child FOLDER``).

Started through :func:`modak.workload.usercode.run_child`, under the export's memory and wall-clock limits: it
loads the model as the export's child does (:func:`modak.workload.usercode_child.load`) and records the aten ops of
one step on fake tensors (:func:`modak.workload.kernels.trace_step`). Nothing here is imported by the planner.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from modak.workload import usercode_child


def trace(request: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The kernels of one step of the user's model at the request's batch, task and loss."""
    from modak.workload.kernels import TRACE, trace_step

    model, shapes = usercode_child.load(request, folder)
    work = request[TRACE]
    inputs = usercode_child.example_inputs(request, shapes, work["batch"])
    kernels = trace_step(model, inputs, work["params"], work["precision"], work["task"], work["loss"], work["graph"])
    return {"ok": True, "kernels": [asdict(k) for k in kernels]}


if __name__ == "__main__":
    sys.exit(usercode_child.main(sys.argv, trace))
