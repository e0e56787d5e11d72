"""How the user's own PyTorch model is called and what its outputs are: one convention for the plan's export
(:mod:`modak.workload.usercode_child`), the kernel trace and the image's PyTorch runtimes.

A model is called as its users call it: by keyword where every input name is a parameter of its ``forward``
(``input_ids=…, attention_mask=…``), else positionally in the order of ``model.input_shape``. Its outputs may be a
tensor, a tuple or list, a mapping or a Hugging Face ``ModelOutput``, nested; :func:`flatten` lists the tensors
in them with their names, and the values that are not tensors (a decoder's key/value cache, ``None``), which
the export leaves out.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OUTPUT = "output"  # the name of a model's only output when it returns one tensor; "output_0", … for a tuple


def by_keyword(model: Any, names: Sequence[str]) -> bool:
    """Whether ``model`` takes the inputs ``names`` by keyword: every name is a named parameter of its forward (of
    a ``torch.export`` program's module: a keyword argument of the export's call)."""
    in_spec = getattr(model, "_in_spec", None)  # TreeSpec of (args, kwargs)
    if in_spec is not None:
        exported = in_spec.child(1).context or []
        return bool(names) and all(name in exported for name in names)
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object without a signature: called positionally
        return False
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return bool(names) and all(name in named for name in names)


def call_model(model: Any, names: Sequence[str], tensors: Sequence[Any], keyword: bool) -> Any:
    """``model`` called on ``tensors`` (in the order of ``names``), by keyword or positionally."""
    return model(**dict(zip(names, tensors))) if keyword else model(*tensors)


@dataclass(frozen=True)
class Outputs:
    """The tensors of a model's outputs with their names (in the order the export lists them), and the names and
    types of the values that are not tensors."""

    names: tuple[str, ...]
    tensors: tuple[Any, ...]
    dropped: tuple[str, ...]  # "past_key_values (DynamicCache)"


def flatten(outputs: Any) -> Outputs:
    """The tensors in ``outputs``: a tensor is :data:`OUTPUT`; a tuple's items are ``output_0``, …; a mapping's
    (a ``ModelOutput``'s set fields) are their keys; nested items are ``key_0``, ``key.sub``."""
    import torch

    names: list[str] = []
    tensors: list[Any] = []
    dropped: list[str] = []

    def visit(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            names.append(name)
            tensors.append(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, key if name == OUTPUT else f"{name}.{key}")
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                visit(item, f"{name}_{index}")
        elif value is not None:
            dropped.append(f"{name} ({type(value).__name__})")

    visit(outputs, OUTPUT)
    return Outputs(tuple(names), tuple(tensors), tuple(dropped))
