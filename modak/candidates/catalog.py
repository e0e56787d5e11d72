"""The runtime catalog: one YAML recipe per runtime/graph compiler under ``recipes/runtimes``."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from modak.candidates.candidate import Candidate, DeviceKind, ParamValue, value_key
from modak.errors import InputError
from modak.paths import data_dir
from modak.spec.loader import load_spec
from modak.spec.models import Allocation, Name, Precision, Requirement, Task

# How the learned model sees a parameter: one column per value, log(1 + value), the candidate's share of the
# cores (the parameter named threads, which the planner resolves to a thread count), or not at all.
FeatureKind = Literal["categorical", "numeric", "threads", "none"]
Fraction = Annotated[float, Field(gt=0, le=1)]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AptPackage = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9+.-]+$")]


class _Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContainerNeeds(_Recipe):
    """What an image needs for this runtime on one device kind."""

    base: Name = Field(description="Logical base image; a target's container.base_images maps it to a mirror.")
    apt: tuple[AptPackage, ...] = ()
    pip: tuple[Requirement, ...] = ()
    pip_index_url: str | None = Field(None, description="Extra index the pins come from (e.g. a CUDA wheel index).")


class Parameter(_Recipe):
    """A tunable parameter: its values, where it applies, and how a value changes the analytic model."""

    name: Name
    values: tuple[ParamValue, ...] = Field(min_length=1)
    devices: tuple[DeviceKind, ...] = ("cpu", "gpu")
    tasks: tuple[Task, ...] = (Task.inference, Task.training)
    precisions: tuple[Precision, ...] | None = Field(
        None, description="Only enumerate at these precisions (e.g. the int8 quantization method); default: all.")
    needs_op_class: str | None = Field(None, description="Only enumerate when the workload has ops of this class.")
    effects: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="value -> {term: factor}; terms: compute.<op_class>, compute, memory, overhead, compile.")
    env: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="value -> environment variables the entrypoint exports.")
    apt: dict[str, tuple[AptPackage, ...]] = Field(default_factory=dict, description="value -> extra apt packages.")
    allocation: dict[Allocation, ParamValue] = Field(
        default_factory=dict, description="kind of allocation (the target's scheduler.allocation) -> the one value "
                                          "enumerated there: the others cannot win on it and are left out.")
    feature: FeatureKind = Field(
        description="How the learned model sees the parameter; default numeric if every value is an integer, "
                    "else categorical.")

    @model_validator(mode="before")
    @classmethod
    def _default_feature(cls, data: Any) -> Any:
        if isinstance(data, dict) and "feature" not in data:
            return {**data, "feature": "numeric" if _integers(data.get("values", ())) else "categorical"}
        return data

    @model_validator(mode="after")
    def _check_feature(self) -> Parameter:
        if self.feature == "threads" and self.name != "threads":
            raise ValueError("feature 'threads' is for the parameter named threads")
        if self.feature == "numeric" and not _integers(self.values):
            raise ValueError("a numeric feature needs integer values")
        if any(value not in self.values for value in self.allocation.values()):
            raise ValueError("allocation names a value the parameter does not list")
        return self

    def values_for(self, allocation: Allocation) -> tuple[ParamValue, ...]:
        """The values enumerated on a kind of allocation: the one ``allocation`` names for it, else all."""
        return (self.allocation[allocation],) if allocation in self.allocation else self.values


def _integers(values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


class Tuning(_Recipe):
    """How a tuning budget (trials) buys compute efficiency, and what each trial costs."""

    parameter: Name
    seconds_per_trial: float = Field(gt=0)
    efficiency: dict[int, float] = Field(description="trial budget -> factor on compute efficiency.")


class DevicePerformance(_Recipe):
    """Priors of the analytic roofline model for one device kind (replaced by the learned model)."""

    compute_efficiency: dict[str, Fraction] = Field(description="op class -> fraction of peak; 'default' required.")
    memory_efficiency: Fraction
    fusion: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="Fraction of elementwise/normalization traffic removed by operator fusion.")
    node_overhead_us: Annotated[float, Field(ge=0)] = Field(description="Dispatch cost per graph node of a forward "
                                                                          "pass (µs).")
    call_overhead_us: Annotated[float, Field(ge=0)] = Field(description="Dispatch cost per inference call (µs).")
    training_node_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="Per forward graph node of a training step: forward, backward and update (µs); "
                          "default 3 x node_overhead_us.")
    training_call_overhead_us: Annotated[float, Field(ge=0)] | None = Field(
        None, description="Per training step (µs); default call_overhead_us.")
    compile_seconds: Annotated[float, Field(ge=0)] = 0.0
    compile_seconds_per_node: Annotated[float, Field(ge=0)] = 0.0


class Recipe(_Recipe):
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
    stock: bool = Field(False, description="The framework's stock deployment (its first precision, every "
                                           "parameter at its first value) is what the plan keeps when the "
                                           "fastest candidates may be over 10% slower than it.")
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


@lru_cache(maxsize=4)
def load_catalog(folder: Path | None = None) -> dict[str, Recipe]:
    """All recipes in ``folder`` (default: the shipped ``recipes/runtimes``), keyed by name."""
    folder = folder or data_dir("recipes") / "runtimes"
    recipes: dict[str, Recipe] = {}
    for path in sorted(folder.glob("*.yaml")):
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
        raise InputError("no runtime recipes found", folder)
    return recipes
