"""torch.compile (Inductor): the PyTorch eager session with the module compiled in the candidate's mode.

Compilation happens on the first step; the runner counts that step's extra time as compile time.
"""

from __future__ import annotations

import numpy as np

from modak.image.runtimes.base import FunctionSession, RunRequest
from modak.image.runtimes.pytorch import build_session


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    import torch

    mode = request.params.get("mode", "default")
    return build_session(request, inputs, wrap=lambda module: torch.compile(module, mode=mode))
