"""The interface every runtime/graph compiler implements, and the registry of them.

A runtime is one module with one :class:`Adapter` subclass, which registers itself under its ``name`` (the recipe's
name, ``recipes/runtimes/<name>.yaml``) and declares what it can do: its framework, the packages its results
depend on, how it reports the kernels it plans (``kernels``) and which of its parameters do not change them
(``run_settings``), whether its profiles name those kernels, whether it runs a layer cut from an ONNX graph, the
GEMM it times for ``modak probe``. The shipped runtimes are the modules of
this package (``modak.image.runtimes.<name>``, ``-`` as ``_``); one outside modak is found through the entry point
group ``modak.runtimes`` (``NAME = module:Class``), and its class names its recipe file (:attr:`Adapter.recipe`).
Every place that asks what a runtime can do asks :func:`adapter` or :func:`adapters`, never a list of names.

``prepare(request, inputs) -> Session`` does everything that is paid once (load, compile, tune) for inputs shaped
like ``inputs`` (one batch of the request's size); ``Session.run(feeds)`` is one steady-state step on ``feeds``:
input name -> array of ``batch_size * batches_per_step`` samples (``batches_per_step`` is 1 unless a session says
otherwise, as OpenVINO's throughput streams do). :mod:`modak.runtime` puts a user's batches in that shape, padding
a partial batch unless the session says ``open_batch`` and one sample gives the full batch's answer for it.
Parameters and container requirements live in the runtime's recipe, which the host reads; this package never does.

A runtime whose runs leave something a later run reuses (TVM's tuning databases) implements ``artifacts(workdir,
model_stem, batch_size, image_model_stem) -> dict[str, Path]``: what an earlier run in ``workdir`` (a request's
``workdir``) left for this model and batch, as path relative to the image's work folder -> host path, named for
the image's runner, whose model stem is ``image_model_stem`` (a model's stem is its zoo name, else its ONNX file's
stem). ``modak build`` copies them into the image.

A runtime that can say where a step's time goes implements ``profile(request, inputs, steps) ->
modak.image.kernels.Profile``: the candidate prepared as ``prepare`` does, warmed up, then ``steps`` profiled steps,
reported as per-kernel times of one step (``modak measure --profile``).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from modak.image.kernels import Kernel, Profile
from modak.paths import installed

if TYPE_CHECKING:
    import numpy as np

# Largest error tolerated before a runtime's output counts as wrong, relative to the reference's largest
# magnitude: fp32 leaves room for reassociation, reduced precisions for their mantissas.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 6e-2, "fp16": 3e-2, "int8": 1e-1}
PROFILE_WARMUP_STEPS = 3  # steps a runtime's ``profile`` runs before its profiled ones


@dataclass(frozen=True)
class RunRequest:
    """Everything a runtime needs to build and run one candidate (JSON-serializable)."""

    runtime: str
    device: str
    precision: str
    params: dict[str, Any]
    threads: int | None
    task: str
    onnx_path: str
    zoo: str | None
    batch_size: int
    input_shapes: dict[str, list[int]]
    workdir: str
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    pytorch: dict[str, Any] | None = None  # the user's own model (Deployment.pytorch), beside onnx_path
    loss: str | None = None  # the training step's loss (Deployment.loss)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        return cls(**json.loads(text))


class Session(Protocol):
    """A prepared model. ``run`` performs one step on ``feeds`` and returns its outputs in the ONNX graph's order
    (training: ``[loss]``)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...


KernelReport = Literal["onnx", "torch"]  # from the runtime's own plan of an ONNX graph; from a PyTorch trace
ENTRY_POINTS = "modak.runtimes"  # the entry point group of runtimes outside modak
_NOT_RUNTIMES = {"base", "profiling", "torch_kernels"}  # this package's modules that are not runtimes


class Adapter:
    """One runtime: what it declares, and its steps (static methods over its module's functions)."""

    name: ClassVar[str]  # the recipe's name
    framework: ClassVar[str]  # the recipe's framework (pytorch, onnxruntime, openvino, tvm, jax)
    packages: ClassVar[tuple[str, ...]] = ()  # the distributions its results depend on, the first the main one
    kernels: ClassVar[KernelReport | None] = None  # how it reports the kernels it plans for a step; None: it does not
    kernel_source: ClassVar[str] = ""  # the module whose code plans those kernels (default: the adapter's)
    profiles_as_planned: ClassVar[bool] = False  # its profiles name the kernels its plan names, by construction
    cut_graphs: ClassVar[bool] = False  # it runs a layer cut from an ONNX graph (``modak probe --kernels``)
    gemm_precisions: ClassVar[tuple[str, ...]] = ()  # the precisions of the GEMM :meth:`gemm` times
    # Its parameters that set how its kernels run, not which it plans ("threads": the parameter and the thread
    # count): a plan's report of its kernels is shared by candidates that differ only in these
    run_settings: ClassVar[tuple[str, ...]] = ()
    recipe: ClassVar[Path | None] = None  # a runtime outside modak: its recipe file (else recipes/runtimes/)
    registry: ClassVar[dict[str, type[Adapter]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in Adapter.registry and Adapter.registry[cls.name] is not cls:
            raise ValueError(f"runtime {cls.name!r} is registered twice ({Adapter.registry[cls.name].__module__}, "
                             f"{cls.__module__})")
        Adapter.registry[cls.name] = cls

    @staticmethod
    def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> Session:
        """The candidate built for inputs shaped like ``inputs`` (see the module docstring); every runtime has it."""
        raise NotImplementedError

    @staticmethod
    def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
        """Where ``steps`` steps' time goes (see the module docstring); a runtime may not implement it."""
        raise NotImplementedError

    @staticmethod
    def artifacts(workdir: Path, model_stem: str, batch_size: int, image_model_stem: str) -> Mapping[str, Path]:
        """What earlier runs left for a later one to reuse (see the module docstring); a runtime may not."""
        raise NotImplementedError

    @staticmethod
    def planned_kernels(request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]]) -> tuple[Kernel, ...]:
        """The kernels it plans for one step of ``request`` on inputs of these shapes (``kernels == "onnx"``)."""
        raise NotImplementedError

    @staticmethod
    def gemm(n: int, threads: int, precision: str) -> Callable[[], Any]:
        """A call of an ``n`` x ``n`` GEMM in ``precision`` on ``threads`` threads (ImportError: not installed)."""
        raise NotImplementedError

    @classmethod
    def implements(cls, step: Callable[..., Any]) -> bool:
        """Whether it implements ``step``, one of this class's optional static methods (``Adapter.profile``)."""
        return getattr(cls, step.__name__) is not step

    @classmethod
    def source_file(cls) -> Path:
        """The file of the module that plans its kernels."""
        module = importlib.import_module(cls.kernel_source or cls.__module__)
        return Path(module.__file__ or "")


def adapter(name: str) -> type[Adapter]:
    """The runtime called ``name``: registered, a module of this package, or an entry point of
    :data:`ENTRY_POINTS`; a :class:`KeyError` naming the known ones otherwise."""
    if name not in Adapter.registry:
        module = f"{__package__}.{name.replace('-', '_')}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            if name in _plugins():
                _plugins()[name].load()
    if name not in Adapter.registry:
        raise KeyError(f"no runtime {name!r} (known: {', '.join(sorted(adapters()))})")
    return Adapter.registry[name]


def adapters() -> dict[str, type[Adapter]]:
    """Every runtime: this package's modules and the entry points of :data:`ENTRY_POINTS`, by name."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name not in _NOT_RUNTIMES:
            importlib.import_module(f"{__package__}.{module.name}")
    _load_plugins()
    return dict(sorted(Adapter.registry.items()))


def plugin_recipes() -> list[Path]:
    """The recipe files of the runtimes outside modak (their entry points loaded)."""
    _load_plugins()
    found = (Adapter.registry.get(name) for name in _plugins())
    return [runtime.recipe for runtime in found if runtime is not None and runtime.recipe is not None]


def _load_plugins() -> None:
    """Load every entry point of :data:`ENTRY_POINTS` not registered yet (loading one registers its class)."""
    for name, point in _plugins().items():
        if name not in Adapter.registry:
            point.load()


@dataclass(frozen=True)
class Plugin:
    """An entry point of :data:`ENTRY_POINTS`: a runtime's name and the ``module:Class`` that registers it."""

    name: str
    value: str

    def load(self) -> Any:
        from importlib.metadata import EntryPoint

        return EntryPoint(self.name, self.value, ENTRY_POINTS).load()


def _plugins() -> dict[str, Plugin]:
    """The entry points of :data:`ENTRY_POINTS` (:func:`modak.paths.installed`)."""
    return {name: Plugin(name, value) for name, value in installed().entry_points.get(ENTRY_POINTS, [])}


Profiler = Callable[[RunRequest, "dict[str, np.ndarray]", int], Profile]


def load_profiler(name: str) -> Profiler | None:
    """Runtime ``name``'s ``profile`` (see the module docstring), or None where it reports no profile."""
    runtime = adapter(name)
    return runtime.profile if runtime.implements(Adapter.profile) else None


def reusable_artifacts(name: str, workdir: Path, model_stem: str, batch_size: int,
                       image_model_stem: str) -> dict[str, Path]:
    """Runtime ``name``'s ``artifacts`` (see the module docstring); ``{}`` when it declares none."""
    runtime = adapter(name)
    if not runtime.implements(Adapter.artifacts):
        return {}
    return dict(runtime.artifacts(workdir, model_stem, batch_size, image_model_stem))


def relative_error(output: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest absolute difference over all outputs, relative to the reference's largest magnitude."""
    import numpy as np

    if len(output) != len(reference):
        return float("inf")
    worst = 0.0
    for out, ref in zip(output, reference):
        out = np.asarray(out, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape or not np.all(np.isfinite(out)):
            return float("inf")
        scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-6)
        worst = max(worst, float(np.max(np.abs(out - ref))) / scale if ref.size else 0.0)
    return worst


def loss_targets(loss: str, output_shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The seeded targets of built-in training loss ``loss`` for a first output of ``output_shape`` (the same in
    every runtime): class labels over its last dimension for cross_entropy, values shaped like it for mse."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    if loss == "cross_entropy":
        return rng.integers(0, output_shape[-1], size=output_shape[:-1]).astype(np.int64)
    return rng.standard_normal(output_shape).astype(np.float32)


def has_graph(request: RunRequest) -> bool:
    """Whether the request has an ONNX graph: all but the user's own model that no exporter could export (whose
    PyTorch runtimes build it from the files beside where the graph would be)."""
    return request.pytorch is None or Path(request.onnx_path).is_file()


def make_inputs(request: RunRequest) -> dict[str, np.ndarray]:
    """Deterministic inputs for the request's ONNX graph, of its inputs' types (without a graph: of the user's
    ``model.input_dtype``): standard normal floats, integer ids below their bound, random booleans."""
    import numpy as np
    import onnx

    rng = np.random.default_rng(request.seed)
    bounds = _index_bounds(request)

    def make(name: str, dtype: Any) -> np.ndarray:
        shape = [request.batch_size, *request.input_shapes[name]]
        if dtype.kind in "iu":
            return rng.integers(0, bounds.get(name, int(request.extra.get("int_input_high", 100))),
                                size=shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)

    if not has_graph(request):
        given = (request.pytorch or {}).get("input_types", {})
        return {name: make(name, np.dtype(given.get(name, ["float32"])[0])) for name in request.input_shapes}
    model = onnx.load(request.onnx_path, load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    return {value.name: make(value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
        value.type.tensor_type.elem_type))) for value in model.graph.input if value.name not in initializers}


def _index_bounds(request: RunRequest) -> dict[str, int]:
    """Exclusive upper bounds of the model's integer inputs (token ids, embedding rows): the zoo's, or the user's
    (``model.input_high``, carried as ``input_types``)."""
    if request.pytorch is not None:
        return {name: int(high) for name, (_, high) in request.pytorch.get("input_types", {}).items()}
    if request.zoo is None:
        return {}
    from modak.image.zoo import get_entry

    return dict(get_entry(request.zoo).index_bounds or {})


@dataclass(frozen=True)
class FunctionSession:
    """A session whose step is a plain function (most runtimes need nothing more); ``open_batch``: the graph it
    runs leaves the batch dimension open, so a step may take fewer samples (:func:`modak.runtime.load` checks)."""

    step: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
    open_batch: bool = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.step(feeds)
