"""torch.compile (Inductor): the PyTorch eager session with the module compiled in the candidate's mode (on a GPU
with ``cuda_graphs``: that mode's CUDA-graph twin, :func:`compile_mode`; ``io`` as PyTorch eager's).

Compilation happens on the first step; the runner counts that step's extra time as compile time. :func:`profile`
reports Inductor's kernels (its fused ``cpp_fused_*`` / ``triton_*`` kernels and the aten ops it calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modak.image.kernels import Profile
from modak.image.runtimes.base import Adapter, FunctionSession, RunRequest
from modak.image.runtimes.pytorch import build_session, profile_steps

if TYPE_CHECKING:
    import numpy as np


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    return build_session(request, inputs, wrap=_compiler(request))


def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
    """The kernels of one profiled step (:func:`modak.image.runtimes.pytorch.profile_steps`), compiled with
    Inductor's kernel profiling on (``cpp.enable_kernel_profile``: its C++ kernels then report to the profiler, as
    its Triton kernels always do), which only the profiled launch pays for."""
    import torch._inductor.config

    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        return profile_steps(request, inputs, steps, wrap=_compiler(request))


# The recipe's modes -> the mode that also captures CUDA graphs (Inductor's cudagraph trees), for cuda_graphs=true
CUDA_GRAPH_MODES = {"default": "reduce-overhead", "max-autotune-no-cudagraphs": "max-autotune"}


def compile_mode(params: Mapping[str, Any], device: str) -> str:
    """``torch.compile``'s mode for a deployment's parameters on ``device``: the recipe's ``mode``, or its
    :data:`CUDA_GRAPH_MODES` twin where ``cuda_graphs`` is on a GPU (a CPU has no CUDA graphs: the mode stays)."""
    mode = str(params.get("mode", "default"))
    if device == "gpu" and params.get("cuda_graphs") is True:
        return CUDA_GRAPH_MODES.get(mode, mode)
    return mode


def _compiler(request: RunRequest) -> Any:
    import torch

    mode = compile_mode(request.params, request.device)
    return lambda module: torch.compile(module, mode=mode)


class TorchCompile(Adapter):
    name = "torch-compile"
    framework = "pytorch"
    packages = ("torch",)
    kernels = "torch"  # its eager ops; its profiles are Inductor's fused kernels, which the plan does not name
    run_settings = ("threads", "wait_policy", "mode", "cuda_graphs", "io")
    kernel_source = "modak.image.runtimes.pytorch"
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
