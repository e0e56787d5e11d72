"""The user's own pre- and post-processing (``model.preprocess``, ``model.postprocess``: ``module:function``) as
the image runs them, and how the image imports a user's module from beside the model file.

- A pre-processing function takes the request's items (``list[bytes]``: the elements of the served BYTES input
  :data:`DATA_INPUT`) and returns the model's inputs by name, one row per item.
- A post-processing function takes the model's outputs by name (NumPy arrays, one row per item) and returns what
  the server answers, by name: arrays of numbers or of strings (sent as BYTES), one row per item.

In the image they run in the server's process (the image is the user's); on the host, modak runs them only in a
child process with time and memory limits (:mod:`modak.workload.processing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_INPUT = "data"  # the served BYTES input a pre-processing function takes


def import_beside(folder: Any, name: str) -> Any:
    """The user's module ``name`` (a ``.py`` file name, or a dotted name of a package) from ``folder``, imported once
    per process as Python imports a module: its body (which may register custom ops with ``torch.library``) runs
    once however many sessions open the model."""
    import importlib
    import importlib.util
    import sys

    if not name.endswith(".py"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        return importlib.import_module(name)
    found = importlib.util.spec_from_file_location(Path(name).stem, Path(folder) / Path(name).name)
    assert found is not None and found.loader is not None
    loaded = sys.modules.get(found.name)
    if loaded is not None and getattr(loaded, "__file__", None) == found.origin:
        return loaded
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    found.loader.exec_module(module)
    return module


def user_function(folder: Path, reference: str) -> Callable[..., Any]:
    """The function ``module:function`` of the user's module beside the model file in ``folder``."""
    module, _, function = reference.rpartition(":")
    found = getattr(import_beside(folder, module), function, None)
    if not callable(found):
        raise ValueError(f"{module} has no function {function}")
    return found  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FunctionInput:
    """The user's pre-processing function: request items in, the model's inputs out."""

    function: Callable[[list[bytes]], Mapping[str, Any]]
    reference: str  # module:function, for messages
    input_name: str = DATA_INPUT

    def encode(self, items: Sequence[bytes | str], dtypes: Mapping[str, Any]) -> dict[str, Any]:
        """The model's inputs for ``items`` (JSON strings as their UTF-8 bytes), as arrays of ``dtypes``;
        ValueError says what the function returned that does not fit."""
        import numpy as np

        made = self.function([item.encode() if isinstance(item, str) else item for item in items])
        if not isinstance(made, Mapping):
            raise ValueError(f"{self.reference} returned {type(made).__name__}, not a mapping of the model's inputs")
        missing, unknown = sorted(set(dtypes) - set(made)), sorted(set(made) - set(dtypes))
        if missing or unknown:
            raise ValueError(f"{self.reference} returned inputs {', '.join(map(str, made)) or 'none'}; the model "
                             f"takes {', '.join(dtypes)}")
        arrays = {name: np.asarray(made[name]).astype(dtypes[name], copy=False) for name in dtypes}
        wrong = [f"{name} {list(a.shape)}" for name, a in arrays.items() if not a.ndim or len(a) != len(items)]
        if wrong:
            raise ValueError(f"{self.reference} returned {', '.join(wrong)} for {len(items)} items (one row each)")
        return arrays


@dataclass(frozen=True)
class FunctionOutput:
    """The user's post-processing function: the model's outputs in, what the server answers out."""

    function: Callable[[dict[str, Any]], Mapping[str, Any]]
    reference: str

    def decode(self, outputs: Mapping[str, Any], samples: int) -> dict[str, Any]:
        """What the function makes of ``outputs`` (``samples`` rows): arrays of numbers, booleans or strings
        (``str`` dtype), one row per sample; ValueError says what does not fit."""
        import numpy as np

        made = self.function({name: np.asarray(value) for name, value in outputs.items()})
        if not isinstance(made, Mapping) or not made or not all(isinstance(k, str) for k in made):
            raise ValueError(f"{self.reference} must return a non-empty mapping of output names to arrays")
        arrays = {}
        for name, value in made.items():
            array = np.asarray(value)
            if array.dtype.kind in "OSU":
                array = np.asarray([v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
                                   ).reshape(array.shape)
            elif array.dtype.kind not in "biuf":
                raise ValueError(f"{self.reference} returned {name} of dtype {array.dtype}: give numbers or strings")
            if not array.ndim or len(array) != samples:
                raise ValueError(f"{self.reference} returned {name} of shape {list(array.shape)} for {samples} "
                                 "samples (one row each)")
            arrays[name] = array
        return arrays
