"""The runtime catalog: one YAML recipe per runtime/graph compiler under ``recipes/runtimes``."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

from modak.candidates.candidate import Candidate, DeviceKind, ParamValue, value_key
from modak.errors import InputError
from modak.image.runtimes.base import plugin_recipes
from modak.paths import cache_dir, data_dir, file_identity, keep_newest, source_identity, write_atomic
from modak.spec.fields import Name, Requirement
from modak.spec.loader import load_spec
from modak.spec.models import Precision, Task
from modak.spec.target import Allocation

# How the learned model sees a parameter: one column per value, log(1 + value), the candidate's share of the
# cores (the parameter named threads, which the planner resolves to a thread count), or not at all.
FeatureKind = Literal["categorical", "numeric", "threads", "none"]
Fraction = Annotated[float, Meta(gt=0, le=1)]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KEPT_CATALOGS = 8  # parsed catalogs kept in the cache (one per recipe files and modak source seen)
AptPackage = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]


class _Recipe(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base: unknown fields are errors, instances are immutable."""


class ContainerNeeds(_Recipe, frozen=True, kw_only=True):
    """What an image needs for this runtime on one device kind."""

    base: Annotated[Name, Meta(description="Logical base image; a target's container.base_images maps it to a mirror.")]
    apt: tuple[AptPackage, ...] = ()
    pip: tuple[Requirement, ...] = ()
    pip_index_url: Annotated[str | None, Meta(description=
        "Extra index the pins come from (e.g. a CUDA wheel index).")] = None


class Parameter(_Recipe, frozen=True, kw_only=True):
    """A tunable parameter: its values, where it applies, and how a value changes the analytic model."""

    name: Name
    values: Annotated[tuple[ParamValue, ...], Meta(min_length=1)]
    devices: tuple[DeviceKind, ...] = ("cpu", "gpu")
    tasks: tuple[Task, ...] = (Task.inference, Task.training)
    precisions: Annotated[tuple[Precision, ...] | None, Meta(description=
        "Only enumerate at these precisions (e.g. the int8 quantization method); default: all.")] = None
    needs_op_class: Annotated[str | None, Meta(description=
        "Only enumerate when the workload has ops of this class.")] = None
    effects: Annotated[dict[str, dict[str, float]], Meta(description=
        "value -> {term: factor}; terms: compute.<op_class>, compute, memory, "
        "overhead, compile.")] = field(default_factory=dict)
    env: Annotated[dict[str, dict[str, str]], Meta(description=
        "value -> environment variables the entrypoint exports.")] = field(default_factory=dict)
    apt: Annotated[dict[str, tuple[AptPackage, ...]], Meta(description=
        "value -> extra apt packages.")] = field(default_factory=dict)
    allocation: Annotated[dict[Allocation, ParamValue], Meta(description=
        "kind of allocation (the target's scheduler.allocation) -> the one value "
        "enumerated there: the others cannot win on it and are left out.")] = field(default_factory=dict)
    given_feature: Annotated[FeatureKind | None, Meta(
        description="How the learned model sees the parameter; default numeric if every value is an integer, else "
                    "categorical.")] = field(default=None, name="feature")

    def __post_init__(self) -> None:
        if self.feature == "threads" and self.name != "threads":
            raise ValueError("feature 'threads' is for the parameter named threads")
        if self.feature == "numeric" and not _integers(self.values):
            raise ValueError("a numeric feature needs integer values")
        if any(value not in self.values for value in self.allocation.values()):
            raise ValueError("allocation names a value the parameter does not list")

    @property
    def feature(self) -> FeatureKind:
        """How the learned model sees the parameter: as the recipe says, else numeric if every value is an integer,
        else categorical."""
        return self.given_feature or ("numeric" if _integers(self.values) else "categorical")

    def values_for(self, allocation: Allocation) -> tuple[ParamValue, ...]:
        """The values enumerated on a kind of allocation: the one ``allocation`` names for it, else all."""
        return (self.allocation[allocation],) if allocation in self.allocation else self.values


def _integers(values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


class Tuning(_Recipe, frozen=True, kw_only=True):
    """How a tuning budget (trials) buys compute efficiency, and what each trial costs."""

    parameter: Name
    seconds_per_trial: Annotated[float, Meta(gt=0)]
    efficiency: Annotated[dict[int, float], Meta(description="trial budget -> factor on compute efficiency.")]


class DevicePerformance(_Recipe, frozen=True, kw_only=True):
    """Priors of the analytic roofline model for one device kind (replaced by the learned model)."""

    compute_efficiency: Annotated[dict[str, Fraction], Meta(description=
        "op class -> fraction of peak; 'default' required.")]
    memory_efficiency: Fraction
    fusion: Annotated[float, Meta(ge=0, le=1, description=
        "Fraction of elementwise/normalization traffic removed by operator fusion.")] = 0.0
    node_overhead_us: Annotated[float, Meta(ge=0, description=
        "Dispatch cost per graph node of a forward pass (µs).")]
    call_overhead_us: Annotated[float, Meta(ge=0, description="Dispatch cost per inference call (µs).")]
    training_node_overhead_us: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "Per forward graph node of a training step: forward, backward and update (µs); default 3 x "
        "node_overhead_us.")] = None
    training_call_overhead_us: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "Per training step (µs); default call_overhead_us.")] = None
    compile_seconds: Annotated[float, Meta(ge=0)] = 0.0
    compile_seconds_per_node: Annotated[float, Meta(ge=0)] = 0.0
    graph_node_overhead_us: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "GPU, cuda_graphs=true: launch cost per graph node replayed in a CUDA graph (µs); None: the runtime has "
        "no CUDA graphs.")] = None
    capture_seconds: Annotated[float, Meta(ge=0, description=
        "GPU, cuda_graphs=true: seconds a graph capture takes per input shape (counted as compile time).")] = 0.0
    capture_seconds_per_node: Annotated[float, Meta(ge=0)] = 0.0


class Recipe(_Recipe, frozen=True, kw_only=True):
    """One runtime or graph compiler."""

    name: Name
    title: str
    framework: Name
    model_format: Literal["onnx", "torch"]
    tasks: tuple[Task, ...]
    precisions: dict[DeviceKind, tuple[Precision, ...]]
    container: dict[DeviceKind, ContainerNeeds]
    parameters: tuple[Parameter, ...] = ()
    tuning: Tuning | None = None
    stock: Annotated[bool, Meta(description="The framework's stock deployment (its first precision, every "
                                           "parameter at its first value) is what the plan keeps when the "
                                           "fastest candidates may be over 10% slower than it.")] = False
    performance: dict[DeviceKind, DevicePerformance]
    notes: str = ""

    def chosen(self, candidate: Candidate) -> tuple[tuple[Parameter, str], ...]:
        """This recipe's parameters that ``candidate`` sets, each with its value as a recipe key."""
        return tuple((p, value_key(value)) for p in self.parameters
                     if (value := candidate.param(p.name)) is not None)

    def environment(self, candidate: Candidate) -> dict[str, str]:
        """The variables ``candidate``'s parameter values set (the entrypoint applies them)."""
        return {k: v for parameter, key in self.chosen(candidate) for k, v in parameter.env.get(key, {}).items()}

    def is_stock(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is this recipe's stock deployment."""
        firsts = {p.name: p.values[0] for p in self.parameters}
        return (self.stock and candidate.runtime == self.name
                and candidate.precision is self.precisions[candidate.device][0]
                and all(k in firsts and firsts[k] == v for k, v in candidate.params))

    @property
    def devices(self) -> tuple[DeviceKind, ...]:
        return tuple(d for d in ("cpu", "gpu") if d in self.container and d in self.performance)


_DECODE = msgspec.json.Decoder(dict[str, Recipe])


@lru_cache(maxsize=4)
def load_catalog(folder: Path | None = None) -> dict[str, Recipe]:
    """All recipes in ``folder`` (default: the shipped ``recipes/runtimes`` and the recipe of every runtime outside
    modak, :func:`modak.image.runtimes.base.plugin_recipes`), keyed by name. Parsed and checked once per content:
    the catalog is kept in modak's cache under its files' paths, sizes, modification times and inodes and modak's
    own source (:func:`modak.paths.source_identity`)."""
    paths = sorted((folder or data_dir("recipes") / "runtimes").glob("*.yaml"))
    if folder is None:
        paths += plugin_recipes()  # the runtimes outside modak (modak.image.runtimes.base.ENTRY_POINTS)
    kept = _kept(paths)
    with contextlib.suppress(OSError, msgspec.DecodeError):
        return _DECODE.decode(kept.read_bytes())
    recipes: dict[str, Recipe] = {}
    for path in paths:
        recipe, doc = load_spec(path, Recipe)
        if recipe.name in recipes:
            raise doc.error(("name",), f"runtime '{recipe.name}' is defined twice")
        for device, perf in recipe.performance.items():
            if "default" not in perf.compute_efficiency:
                raise doc.error(("performance", device, "compute_efficiency"), "needs a 'default' entry")
        for index, parameter in enumerate(recipe.parameters):
            for value, variables in parameter.env.items():
                for variable in variables:
                    if not _ENV_NAME.fullmatch(variable):
                        raise doc.error(("parameters", index, "env", value),
                                        f"invalid environment variable name {variable!r}")
        recipes[recipe.name] = recipe
    if not recipes:
        raise InputError("no runtime recipes found", folder or data_dir("recipes") / "runtimes")
    with contextlib.suppress(OSError):  # a cache that cannot be written (an image's read-only home) is not kept
        write_atomic(kept, msgspec.json.encode(recipes))
        keep_newest(kept.parent, "*.json", KEPT_CATALOGS)
    return recipes


def _kept(paths: Sequence[Path]) -> Path:
    """Where the catalog of the recipe files ``paths`` is kept in modak's cache."""
    digest = hashlib.sha256(f"catalog\0{source_identity()}".encode())
    for path in paths:
        digest.update(f"\0{file_identity(path)}".encode())
    return cache_dir() / "catalogs" / f"{digest.hexdigest()[:32]}.json"
