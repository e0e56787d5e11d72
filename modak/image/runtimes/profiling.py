"""What the profile functions of the PyTorch family and TVM share: a kernel's op class from its name, and the
choice of the profiled step whose kernels a :class:`modak.image.kernels.Profile` reports.

A profile reports the kernels of ONE step, the median one by wall time: its kernels ran inside it, so their times
add up to no more than the step (summing across steps and dividing would not keep that for a noisy step).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WARMUP_STEPS = 2  # unprofiled steps before the profiled ones (torch.compile compiles in the first)

# Words of a kernel's name (split at anything not a letter or digit, ``_`` included) that give its op class,
# costliest class first: a fused kernel takes the class of its costliest word.
# Classes whose words are prefixes (``conv2d``, ``max_pool2d``, ``native_batch_norm``) match by substring.
PRIORITY = ("conv", "matmul", "recurrent", "normalization", "pooling", "softmax", "reduction", "embedding",
            "elementwise", "data_movement")  # OP_CLASSES but "other", costliest first
_SUBSTRINGS = {"conv": ("conv",), "normalization": ("norm",), "pooling": ("pool",)}
_WORDS = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "linear", "dense", "gemm",
               "einsum"},
    "recurrent": {"lstm", "gru", "rnn"},
    "softmax": {"softmax"},
    "reduction": {"mean", "sum", "amax", "amin", "max", "min", "argmax", "argmin", "prod"},
    "embedding": {"embedding", "embeddingbag"},
    "elementwise": {"add", "sub", "rsub", "mul", "div", "relu", "gelu", "silu", "sigmoid", "tanh", "exp", "log",
                    "pow", "sqrt", "rsqrt", "clamp", "threshold", "where", "neg", "abs", "erf",
                    "hardtanh", "hardswish", "hardsigmoid", "dropout", "lerp",
                    "addcmul", "addcdiv", "square", "reciprocal", "bias", "maximum", "minimum", "multiply",
                    "divide", "subtract", "sign"},
    "data_movement": {"view", "reshape", "transpose", "permute", "t", "cat", "concat", "concatenate", "stack",
                      "split", "slice", "select", "expand", "copy", "clone", "contiguous", "to", "gather", "index",
                      "take", "pad", "squeeze", "unsqueeze", "flatten", "detach", "empty", "zeros",
                      "zero", "ones", "fill", "strided", "alloc", "layout", "broadcast"},
}


def op_class(name: str) -> str:
    """The op class (:data:`OP_CLASSES`) of a kernel named ``name`` (``aten::convolution_backward``,
    ``cpp_fused_add_relu``, ``fused_conv2d_add_relu``): the costliest class any of its words names, else
    ``other``."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    for cls in PRIORITY:
        if any(part in w for part in _SUBSTRINGS.get(cls, ()) for w in words) or \
                any(w in _WORDS.get(cls, ()) for w in words):
            return cls
    return "other"


def median_step(walls: Sequence[float]) -> int:
    """The index of the median step by wall time (the lower median of an even count)."""
    if not walls:
        raise ValueError("a profile needs at least one profiled step")
    return sorted(range(len(walls)), key=walls.__getitem__)[(len(walls) - 1) // 2]
