"""``modak probe --kernels``: this machine's kernel rows in minutes (#40 item 4), as nn-Meter's adaptive sampling.

The shapes come from the zoo's real layers: each zoo model's graph, at a few batch sizes, as each ONNX runtime
plans it (:func:`modak.workload.kernels.planned_kernels`), gives one :class:`Layer` per distinct planned kernel
(kind, shapes, attributes) that covers ONNX nodes; the layer is the subgraph of those nodes, cut out as a small
ONNX model with the batch left symbolic. A sampled layer is measured through the real launcher as ``modak bench
--kernels`` measures a candidate (:func:`measure_job`: one short timed launch, then one profiled launch), at the
machine's thread count and fp32 (and bf16 where the CPU has native bf16), and its kernel rows and reconciliation
go into the perf store under the machine name plans of target ``local`` use. Only the kernel rows: the layer's
timed row is no whole-model measurement and stays out of the store. First, a few whole zoo models
(:data:`WHOLE_MODELS`) are profiled the same way: a one-layer session is mostly the fixed cost of a run, so what a
step adds to its kernels (dispatch, the profiler's cost, the calibration) is learned from whole steps.

Sampling (:func:`sample`): an initial random draw, then rounds: fit the per-kind models on the rows so far, predict
a drawn batch before measuring it, and draw the next batch near (same runtime and kind, the nearest FLOPs) the
layers whose kinds had the largest error, until the budget is spent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modak.errors import InputError, ModakError
from modak.image.runtimes.base import adapter, adapters
from modak.measurements.kernels import PROBE_MODEL_PREFIX, KernelRow, Reconciliation
from modak.measurements.store import PerfStore
from modak.plan import Plan
from modak.predict.kernel_terms import per_call_seconds

if TYPE_CHECKING:
    import onnx

PROBE_BATCHES = (1, 8, 32)  # the batch sizes each zoo model's layers are taken at
DEFAULT_BUDGET_MIN = 15.0  # modak probe --kernels: minutes, at most
ANALYSIS_SHARE = 0.3  # the share of the budget the zoo's analysis may take (exports and plans are cached)
INITIAL_SHARE = 0.4  # the share of the budget spent on the initial random draw
ROUND_SIZE = 4  # layers per adaptive round (predicted before they are measured)
PROBE_STEPS = 5  # profiled steps per layer
# Whole zoo models (name, batch) profiled first, on each runtime: what a step adds to its kernels (dispatch, the
# profiler's cost, the calibration) is learned from whole steps, which a one-layer session is not.
# Enough that a model held out still leaves its runtime MIN_CALIBRATION steps (perfmodels/README.md, "The seventh
# round").
WHOLE_MODELS = (("mnist_cnn", 8), ("mlp", 64), ("squeezenet", 1), ("mobilenet_v2", 1), ("resnet18", 1),
                ("bert_small", 1), ("efficientnet_b0", 1), ("gpt_small", 1), ("unet_small", 1))
WHOLE_SHARE = 0.2  # the share of the budget after which no whole model is started


def probe_runtimes() -> tuple[str, ...]:
    """The runtimes a layer cut from an ONNX graph runs on (``Adapter.cut_graphs``; PyTorch traces zoo models)."""
    return tuple(name for name, runtime in adapters().items() if runtime.cut_graphs)


@dataclass(frozen=True)
class Layer:
    """One distinct layer configuration of the zoo, as ``runtime`` plans it: the planned kernel's ``kind``,
    ``shapes`` and ``attributes`` at ``batch_size``, the ONNX ``nodes`` it covers in zoo model ``model``."""

    runtime: str
    kind: str
    shapes: tuple[tuple[int, ...], ...]
    attributes: str
    flops: float
    bytes: float
    model: str
    nodes: tuple[str, ...]
    batch_size: int

    @property
    def name(self) -> str:
        """The model name its rows carry: one configuration per layer in the store, naming the zoo model it was
        drawn from (a leave-one-model-out split drops the layers of the held-out model;
        :func:`modak.measurements.kernels.probed_from` reads it back)."""
        key = json.dumps([self.runtime, self.kind, self.shapes, self.attributes, self.batch_size])
        return f"{PROBE_MODEL_PREFIX}{self.model}-{self.runtime}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def zoo_layers(models: Iterable[str], runtimes: Sequence[str] | None = None,
               batches: Sequence[int] = PROBE_BATCHES, threads: int = 0,
               more: Callable[[], bool] = lambda: True) -> list[Layer]:
    """The distinct layers of zoo ``models`` at ``batches`` as each of ``runtimes`` plans them (a model or runtime
    that cannot be planned is left out), in a stable order; no model is started once ``more()`` is false (the
    first always is)."""
    from modak.image.zoo import get_entry
    from modak.workload.kernels import planned_kernels
    from modak.workload.zoo import export_onnx

    seen: dict[tuple, Layer] = {}
    for index, model in enumerate(models):
        if index and not more():
            break
        try:
            path = export_onnx(model)
        except ModakError:
            continue
        shapes = {name: list(dims) for name, dims in get_entry(model).shapes(None).items()}
        for runtime in runtimes if runtimes is not None else probe_runtimes():
            for batch in batches:
                try:
                    kernels = planned_kernels(runtime, path, batch, shapes, "fp32", threads, zoo=model)
                except ModakError:
                    continue
                for kernel in kernels:
                    key = (runtime, *kernel.key())
                    if kernel.nodes and key not in seen:
                        seen[key] = Layer(runtime, kernel.kind, kernel.shapes, kernel.attributes, kernel.flops,
                                          kernel.bytes, model, kernel.nodes, batch)
    return list(seen.values())


def cut(onnx_path: Path, nodes: Sequence[str]) -> onnx.ModelProto:
    """The subgraph of ``onnx_path``'s ``nodes`` (and the Constant nodes they read) as an ONNX model: its inputs the
    tensors they read that no covered node writes and no initializer holds, its outputs what they write that
    the rest of the graph reads or the graph outputs. An ``InputError`` where an input is not a float tensor with
    the batch as its first dimension (a shape computed from another tensor: no layer to probe alone)."""
    import onnx
    from onnx.utils import Extractor

    model = onnx.shape_inference.infer_shapes(onnx.load(str(onnx_path)))
    graph = model.graph
    constants = {out: node for node in graph.node if node.op_type == "Constant" for out in node.output}
    chosen = [n for n in graph.node if n.name in set(nodes)]
    chosen_names = {n.name for n in chosen}
    chosen = [*{constants[i].name: constants[i] for n in chosen for i in n.input if i in constants}.values(), *chosen]
    chosen_names |= {n.name for n in chosen}
    written = {o for n in chosen for o in n.output}
    weights = {i.name for i in graph.initializer}
    inputs = list(dict.fromkeys(i for n in chosen for i in n.input if i and i not in written and i not in weights))
    read_outside = {i for n in graph.node if n.name not in chosen_names for i in n.input}
    outputs = [o for n in chosen for o in n.output if o in read_outside or o in {g.name for g in graph.output}]
    extractor = Extractor(model)
    outputs = outputs or [chosen[-1].output[0]]
    types = {v.name: v.type for v in (*extractor.graph.input, *extractor.graph.value_info)}
    for name in inputs:
        tensor = types.get(name)
        dims = tensor.tensor_type.shape.dim if tensor is not None else []
        if (tensor is None or tensor.tensor_type.elem_type != onnx.TensorProto.FLOAT or not dims
                or not dims[0].dim_param):
            raise InputError(f"layer input {name} is not a float tensor of the batch")
    return extractor.extract_model(inputs, outputs)


def write_layer(layer: Layer, folder: Path) -> Path:
    """The job file of ``layer``'s cut graph (:func:`write_job`)."""
    from modak.workload.zoo import export_onnx

    return write_job(layer.name, cut(export_onnx(layer.model), layer.nodes), layer.batch_size, layer.runtime, folder)


def write_whole(model: str, batch_size: int, runtime: str, folder: Path) -> Path:
    """The job file of zoo ``model``'s whole graph (:func:`write_job`; its rows carry the zoo name)."""
    import onnx

    from modak.workload.zoo import export_onnx

    return write_job(model, onnx.load(str(export_onnx(model))), batch_size, runtime, folder)


def write_job(name: str, graph: onnx.ModelProto, batch_size: int, runtime: str, folder: Path) -> Path:
    """The job file, in ``folder``, of ``graph`` saved as ``name``.onnx (the rows' model name) at ``batch_size`` on
    ``runtime``, target ``local``: fp32, and bf16 where this CPU has native bf16."""
    import onnx
    import yaml

    from modak.hardware.probe import native_bf16

    precisions = ["fp32", *(["bf16"] if native_bf16() else [])]
    onnx_file = folder / f"{name}.onnx"
    onnx.save(graph, str(onnx_file))
    job = {"apiVersion": "modak/v1", "kind": "Job", "name": name, "target": "local", "task": "inference",
           "model": {"onnx": onnx_file.name, "batch_size": batch_size}, "precision": precisions,
           "frameworks": [runtime], "objective": {"metric": "throughput"}}
    job_file = folder / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    return job_file


def measure_job(runtime: str, plan: Plan, folder: Path,
                steps: int = PROBE_STEPS) -> tuple[list[KernelRow], list[Reconciliation]]:
    """A probe's job measured through the launcher as ``modak bench --kernels`` measures a candidate: ``plan``, the
    plan of its job (:func:`write_job`) on target ``local``, each candidate of ``runtime`` on the CPU at the
    machine's thread count (the plan's) at each precision of its job once timed (briefly) and once profiled
    (again while inflated: :meth:`modak.bench.harness.Session.profile`); the kernel rows and reconciliations
    (none where a launch failed)."""
    from modak.bench.harness import BenchSettings, Session
    from modak.candidates.candidate import Precision

    threads = max((r.candidate.threads or 0 for r in plan.ranked), default=0)
    chosen, seen = [], set()
    for ranked in plan.ranked:
        c = ranked.candidate
        key = (c.precision, c.threads)
        if (c.runtime == runtime and c.device == "cpu" and c.threads == threads
                and c.precision in (Precision.fp32, Precision.bf16) and key not in seen):
            seen.add(key)
            chosen.append(c)
    settings = BenchSettings(launches=1, min_seconds=0.2, budget_s=1.0, retries=1, kernel_steps=steps)
    scratch = PerfStore(folder / "timed.sqlite")  # the timed rows: a layer's are no model's, a whole model's brief
    try:
        with Session(plan, scratch, settings, workdir=folder / "work") as session:
            rows = session.run_round(chosen)
            session.profile(chosen, rows, statuses=("ok", "contended"))  # contended: busy after its retry
        return scratch.kernel_rows(), scratch.reconciliations()
    finally:
        scratch.close()


@dataclass
class Sampling:
    """What :func:`sample` did: the layers measured in order, their rows, each adaptive round's error by (runtime,
    kind); :func:`probe_kernels` adds how many layers it drew from and the whole models it profiled first (model
    name, seconds since the start when its last runtime ended), whose rows come first. The rows carry the ceilings
    of the target they were planned on (the probe's), as every kernel row does."""

    drawn_from: int = 0
    wholes: list[tuple[str, float]] = field(default_factory=list)
    measured: list[Layer] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)  # seconds since the start when each measured layer ended
    rows: list[KernelRow] = field(default_factory=list)
    reconciliations: list[Reconciliation] = field(default_factory=list)
    errors: list[dict[tuple[str, str], float]] = field(default_factory=list)


def sample(layers: Sequence[Layer], measure: Callable[[Layer], tuple[list[KernelRow], list[Reconciliation]]],
           budget_s: float, predict: Callable[[Sequence[KernelRow], KernelRow], float | None] | None = None,
           clock: Callable[[], float] = time.monotonic, seed: int = 0) -> Sampling:
    """Measure ``layers`` within ``budget_s`` seconds of ``clock``: a random draw for :data:`INITIAL_SHARE` of the
    budget, then rounds of :data:`ROUND_SIZE` layers, each layer's fp32 kernel predicted from the rows measured
    before it (``predict``: seconds per call, None where its kind has no model; held out, since it is fit without
    the layer's rows), the next round drawn near the kinds with the largest error so far (unseen kinds first). No
    layer is started once the budget is spent, except the first: a probe whose analysis took the whole budget still
    measures one layer."""
    rng = random.Random(seed)
    start = clock()
    left = list(layers)
    rng.shuffle(left)
    done = Sampling()
    error: dict[tuple[str, str], float] = {}

    def spent() -> float:
        return clock() - start

    def run(layer: Layer) -> list[KernelRow]:
        rows, recs = measure(layer)
        done.measured.append(layer)
        done.finished.append(spent())
        done.rows.extend(rows)
        done.reconciliations.extend(recs)
        return rows

    while left and (not done.measured or spent() < budget_s * INITIAL_SHARE):
        run(left.pop())
    while left and spent() < budget_s:
        batch = _draw(left, done.measured, error, rng)
        round_errors: dict[tuple[str, str], list[float]] = {}
        for layer in batch:
            if spent() >= budget_s:
                break
            left.remove(layer)
            before = list(done.rows)
            for row in run(layer):
                predicted = predict(before, row) if predict and row.precision == "fp32" else None
                if predicted:
                    round_errors.setdefault((layer.runtime, layer.kind), []).append(
                        abs(predicted / per_call_seconds(row) - 1))
        for key, values in round_errors.items():
            error[key] = statistics.mean(values)
        done.errors.append(dict(error))
    return done


def _draw(left: Sequence[Layer], measured: Sequence[Layer], error: Mapping[tuple[str, str], float],
          rng: random.Random) -> list[Layer]:
    """The next round of :data:`ROUND_SIZE` layers: one of each kind never measured, then one of each kind measured
    but never predicted, then the rest of the round near (nearest FLOPs to its measured layers) the kinds with the
    largest error first."""
    kinds = sorted({(layer.runtime, layer.kind) for layer in left})
    seen = {(m.runtime, m.kind) for m in measured}
    rng.shuffle(kinds)
    order = sorted(kinds, key=lambda k: (k in seen, k in error, -error.get(k, 0.0)))
    batch: list[Layer] = []
    for key in order:
        pool = [layer for layer in left if (layer.runtime, layer.kind) == key]
        anchors = [math.log1p(m.flops) for m in measured if (m.runtime, m.kind) == key]
        if anchors:
            pool.sort(key=lambda layer: min(abs(math.log1p(layer.flops) - a) for a in anchors))
        batch.extend(pool[:ROUND_SIZE - len(batch) if key in error else 1])
        if len(batch) >= ROUND_SIZE:
            break
    return batch[:ROUND_SIZE]


def kind_predictor(rows: Sequence[KernelRow], row: KernelRow) -> float | None:
    """``predict`` for :func:`sample`: the per-kind model of :mod:`modak.predict.kernels` fit on the fp32 ``rows`` of
    ``row``'s runtime and kind, ``row``'s kernel's seconds per call; None where there are none."""
    from modak.predict.kernel_fit import fit_kinds, kernel_seconds
    from modak.predict.kernel_terms import MachineCeilings, row_candidate

    own = [r for r in rows if (r.runtime, r.device, r.kernel.kind, r.precision)
           == (row.runtime, row.device, row.kernel.kind, "fp32")]
    if not own:
        return None
    times = kernel_seconds(fit_kinds(own, pooled=False), row.runtime, row.device, [row.kernel],
                           MachineCeilings.of_row(row), row_candidate(row))
    return times[0].seconds if times else None


def probe_kernels(plan_of: Callable[[Path], Plan], store: PerfStore, budget_min: float = DEFAULT_BUDGET_MIN,
                  models: Sequence[str] | None = None, runtimes: Sequence[str] | None = None,
                  seed: int = 0, clock: Callable[[], float] = time.monotonic) -> Sampling:
    """Probe this machine's kernels within ``budget_min`` minutes (the zoo's analysis included): profile the
    :data:`WHOLE_MODELS` among zoo ``models`` (default: all) within :data:`WHOLE_SHARE` of the budget, then sample
    the layers of ``models`` on each of ``runtimes`` installed; add their kernel rows and reconciliations to
    ``store``."""
    import importlib.util

    from modak.image.zoo import ZOO

    start = clock()
    runtimes = probe_runtimes() if runtimes is None else runtimes
    installed = [r for r in runtimes if importlib.util.find_spec(adapter(r).packages[0]) is not None]
    if not installed:
        raise InputError(f"none of the runtimes {', '.join(runtimes)} is installed here")
    order = list(models if models is not None else ZOO)
    random.Random(seed).shuffle(order)
    layers = zoo_layers(order, installed, more=lambda: clock() - start < budget_min * 60 * ANALYSIS_SHARE)
    if not layers:
        raise InputError("the zoo models gave no layer to probe")
    with tempfile.TemporaryDirectory(prefix="modak-kprobe-") as scratch:
        folder = Path(scratch)

        def measure(runtime: str, name: str, write: Callable[[Path], Path]) -> tuple[list[KernelRow],
                                                                                        list[Reconciliation]]:
            job_folder = folder / f"{name}-{runtime}"
            job_folder.mkdir(exist_ok=True)
            try:
                plan = plan_of(write(job_folder))
                assert isinstance(plan, Plan)
                rows, recs = measure_job(runtime, plan, job_folder)
            except ModakError:  # a layer its runtime cannot run alone, or a cut graph the plan refuses
                return [], []
            store.add_kernels(rows, recs)
            return rows, recs

        whole_rows: list[KernelRow] = []
        whole_recs: list[Reconciliation] = []
        wholes: list[tuple[str, float]] = []
        whole_end = clock() + budget_min * 60 * WHOLE_SHARE
        for model, batch in ((m, b) for m, b in WHOLE_MODELS if m in order):
            if clock() >= whole_end:
                break
            for runtime in installed:
                rows, recs = measure(runtime, model, functools.partial(write_whole, model, batch, runtime))
                whole_rows += rows
                whole_recs += recs
            wholes.append((model, clock() - start))
        done = sample(layers, lambda layer: measure(layer.runtime, layer.name, lambda f: write_layer(layer, f)),
                      budget_min * 60 - (clock() - start), kind_predictor, clock, seed)
    done.drawn_from = len(layers)
    done.wholes = wholes
    done.rows[:0] = whole_rows
    done.reconciliations[:0] = whole_recs
    return done
