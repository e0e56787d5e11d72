"""modak's Python API: what the command line does, without parsing arguments or printing.

Every function takes paths and options and returns typed results; :func:`modak.documents.document` makes the
JSON documents the commands print (``--json``), so that each carries the schema version in one way.

>>> from modak import api
>>> plan = api.plan_job("examples/mnist-cnn-cpu/job.yaml")      # doctest: +SKIP
>>> api.render_plan(plan, "out/mnist-cnn")                        # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from modak.advise.pack import PackResult
    from modak.advise.whatif import WhatIf
    from modak.bench.harness import BenchSettings
    from modak.bench.tune import TuneResult, TuneSettings
    from modak.build.pipeline import BuildOptions, BuildResult, Progress
    from modak.build.submit import Submission
    from modak.candidates.enumerate import Candidate
    from modak.hardware.probe import ProbeResult
    from modak.image.zoo import ZooEntry
    from modak.integrations.check import CheckResult
    from modak.measurements.store import Measurement, TunedChoice
    from modak.plan import Plan
    from modak.predict.base import Predictor
    from modak.predict.data import TrainingData
    from modak.predict.evaluate import Scores
    from modak.render.ir import BuildDescription
    from modak.render.sharing import Sharing
    from modak.scaling import ScaleAdvice
    from modak.spec.loader import LoadedJob
    from modak.workload.analysis import WorkloadProfile

PredictorName = Literal["default", "learned", "roofline"]


def load(job: str | Path, target: str | Path | None = None) -> LoadedJob:
    """The job and its target, validated, with every file they refer to checked; target ``local`` (and a target
    file's ``cpu: local``) is this machine's cached probe."""
    from modak.spec.loader import load_job

    return load_job(job, target, _local_machine)


def _local_machine() -> dict[str, Any]:
    """This machine's cpu, memory (and gpus) sections, from its cached probe (imported only for a local target)."""
    from modak.hardware.local import local_sections

    return local_sections()


def predictor(name: PredictorName = "default", store: Path | None = None) -> Predictor:
    """``default``: the kernel model where the runtime's planned kernels are covered (shipped kernel rows plus the
    local ``store``'s), then the learned model (shipped measurements plus the local ``store``), then the roofline
    where neither has data; ``learned``: the same without the kernel model (the whole-model baseline);
    ``roofline``: the analytic model alone."""
    from modak.predict.default import default_predictor
    from modak.predict.roofline import RooflinePredictor

    return RooflinePredictor() if name == "roofline" else default_predictor(store, kernels=name == "default")


def plan_job(job: str | Path, target: str | Path | None = None, predictor_name: PredictorName = "default",
             store: Path | None = None, using: Predictor | None = None) -> Plan:
    """Load, resolve and analyse the job, then rank its candidates (``using`` overrides the named predictor). With
    ``model.batch_size: auto``, the plan of the batch size with the most predicted samples per second within the
    limits (:func:`modak.batching.choose_batch`): its job has that batch, and its ``batches`` list every one tried."""
    return plan_loaded(load(job, target), using or predictor(predictor_name, store), store)


def plan_loaded(loaded: LoadedJob, using: Predictor, store: Path | None = None) -> Plan:
    """:func:`plan_job` of a job already loaded (e.g. with its target changed: ``modak whatif``, ``modak pack``)."""
    from modak.batching import choose_batch
    from modak.plan import make_plan, with_processing
    from modak.spec.models import AUTO_BATCH
    from modak.workload.source import load_analysis

    def plan_at(concrete: LoadedJob) -> Plan:
        source, workload = load_analysis(concrete)
        tuned, measured = measured_on_target(concrete, workload, store)
        return make_plan(concrete, source, workload, using, tuned=tuned, measured=measured)

    return with_processing(choose_batch(loaded, plan_at) if loaded.job.model.batch_size == AUTO_BATCH
                           else plan_at(loaded))


def measured_on_target(loaded: LoadedJob, workload: WorkloadProfile,
                       store: Path | None = None) -> tuple[TunedChoice | None, list[Measurement]]:
    """What the perf store holds for this job's workload on its target: the winner ``modak tune`` recorded, if any,
    and the workload's rows there (every status)."""
    from modak.measurements.store import PerfStore, as_json, default_store_path
    from modak.plan import workload_identity

    path = store or default_store_path()
    if not path.exists():
        return None, []
    with PerfStore(path) as perf:
        rows = perf.rows(machine=loaded.target.name, model=workload.model_name, task=workload.task.value,
                         batch_size=workload.batch_size, flops=workload.flops, nodes=len(workload.ops),
                         input_shapes=as_json({k: list(v) for k, v in workload.input_shapes.items()}))
        return perf.tuned(loaded.target.name, workload_identity(loaded, workload)), rows


@dataclass(frozen=True)
class Rendered:
    """A rendered build context: its description and the generated files."""

    ir: BuildDescription
    files: tuple[Path, ...]


def render_plan(plan: Plan, out_dir: str | Path, sharing: Sharing | None = None) -> Rendered:
    """Write the plan's build context (Dockerfile, Singularity.def, entrypoint.sh, job.sh, plan.json, files);
    ``sharing``: how the job shares its node or GPU (``modak pack``), rendered into its job script."""
    from modak.render.ir import build_description
    from modak.render.render import render

    ir = build_description(plan, sharing=sharing)
    return Rendered(ir, tuple(render(ir, Path(out_dir))))


def default_output(plan: Plan) -> Path:
    """``out/<job name>``, the default output folder of ``modak build`` and ``modak submit``."""
    return Path("out") / plan.loaded.job.name


def build(plan: Plan, out_dir: str | Path | None = None, options: BuildOptions | None = None,
          progress: Progress | None = None, submit_job: bool = False) -> BuildResult:
    """Render, build, label, smoke-test and tag the plan's image (and push or archive it, as ``options`` say); with
    ``submit_job``, then submit its job script (:func:`submit_rendered`)."""
    from dataclasses import replace

    from modak.build.pipeline import BuildOptions, build_job

    out = Path(out_dir) if out_dir else default_output(plan)
    result = build_job(plan, out, options or BuildOptions(), progress)
    if not submit_job:
        return result
    submission = submit_rendered(result.ir, out)
    return replace(result, job_id=submission.job_id, submission=submission.to_dict())


@dataclass(frozen=True)
class MeasuredChoice:
    """What ``modak build`` measured before it chose: the race (None where it did not measure) and a sentence."""

    race: TuneResult | None
    summary: str


def measure_choice(plan: Plan, budget_s: float, store: Path | None = None,
                   on_launch: Callable[[Candidate, dict], None] | None = None,
                   on_round: Callable[[int, list[str], list[str]], None] | None = None) -> MeasuredChoice:
    """Race the predicted best of each runtime and precision (:func:`modak.bench.tune.each_runtime`) on the job's
    target within ``budget_s`` seconds and record the winner, so that the job planned again chooses it (#66).
    It measures only where it can and should: the target is this machine, ``budget_s`` is positive, the plan's
    choice was not measured already, and two candidates or more fit the budget; else the summary says why not."""
    from modak.bench.harness import BenchSettings
    from modak.bench.tune import MEASURE_LAUNCH_SECONDS, TuneSettings, each_runtime
    from modak.bench.tune import tune as race
    from modak.measurements.store import PerfStore

    target = plan.loaded.target.name
    if plan.tuned is not None:
        return MeasuredChoice(None, f"chosen by measurement on {target} ({plan.tuned.measured_at}): "
                                    f"{plan.tuned.summary}")
    if budget_s <= 0:
        return MeasuredChoice(None, "chosen by prediction: no measurement budget (--measure-budget 0)")
    if not plan.loaded.here:
        return MeasuredChoice(None, f"chosen by prediction: target '{target}' is not this machine (`modak tune "
                                    "--dispatch slurm` measures on the target's cluster)")
    settings = TuneSettings(budget_s=budget_s, protocol=BenchSettings(min_seconds=MEASURE_LAUNCH_SECONDS))
    finalists = each_runtime(plan, settings.trials, budget_s)
    if len(finalists) < 2:
        return MeasuredChoice(None, f"chosen by prediction: {len(finalists)} candidate(s) to measure within "
                                    f"{budget_s:g} s")
    with PerfStore(store) as perf:
        result = race(plan, perf, settings, on_launch=on_launch, on_round=on_round, finalists=finalists,
                      command="modak build")
    if result.recorded is None:
        return MeasuredChoice(result, f"chosen by prediction: the race recorded no winner ({result.stopped})")
    return MeasuredChoice(result, f"chosen by measurement: {result.winner} of {len(finalists)} candidates "
                                  f"(the predicted best of each runtime and precision) in {result.seconds:.0f} s")


def submit(plan: Plan, out_dir: str | Path | None = None, wait_seconds: float | None = None) -> Submission:
    """Render the plan and submit its job script to the target's scheduler (waiting up to ``wait_seconds``)."""
    out = (Path(out_dir) if out_dir else default_output(plan)).absolute()
    return submit_rendered(render_plan(plan, out).ir, out, wait_seconds)


def submit_rendered(ir: BuildDescription, out_dir: str | Path, wait_seconds: float | None = None) -> Submission:
    """Submit the job script of a build context already rendered into ``out_dir`` from ``ir`` (waiting up to
    ``wait_seconds``)."""
    from modak.build.submit import submit as submit_script
    from modak.build.submit import wait

    submission = submit_script(Path(out_dir) / "job.sh", ir.job.scheduler, ir.job.log_file)
    if wait_seconds is not None:
        wait(submission, timeout=wait_seconds)
    return submission


def bench(plan: Plan, selection: Sequence[str], settings: BenchSettings, store: Path | None = None,
          on_launch: Callable[[Candidate, dict], None] | None = None,
          on_profile: Callable[[Candidate, dict], None] | None = None) -> tuple[list[Measurement], Path]:
    """Measure the selected candidates (:func:`modak.bench.harness.select_candidates`) with the measurement protocol,
    storing their rows in the perf store after every round, then (``settings.kernel_steps``) their kernel rows from
    one profiled launch each; the rows and the store's path. Ctrl-C keeps what was measured."""
    from modak.bench.harness import bench as measure
    from modak.bench.harness import select_candidates
    from modak.measurements.store import PerfStore

    with PerfStore(store) as perf:
        rows = measure(plan, select_candidates(plan, list(selection)), perf, settings, on_launch=on_launch,
                       on_profile=on_profile)
        return rows, perf.path


@dataclass(frozen=True)
class KernelFiles:
    """CSV files of kernel rows and reconciliations, read into the perf store or written from it."""

    store: Path
    files: tuple[tuple[Path, int], ...]  # each file and its rows


def import_kernels(paths: Sequence[Path], store: Path | None = None) -> KernelFiles:
    """Add the kernel rows and reconciliations of CSV files (either format) to the perf store, all or none: a
    damaged file is an input error naming its file, line and column, and nothing is stored."""
    from modak.measurements.kernels import read_labels_csv
    from modak.measurements.store import PerfStore

    read = [(path, read_labels_csv(path)) for path in paths]
    with PerfStore(store) as perf:
        perf.add_kernels([r for _, (kernels, _) in read for r in kernels],
                         [r for _, (_, reconciled) in read for r in reconciled])
        return KernelFiles(perf.path, tuple((path, len(kernels) + len(reconciled))
                                            for path, (kernels, reconciled) in read))


def export_kernels(folder: Path, store: Path | None = None, machine: str | None = None) -> KernelFiles:
    """Write the perf store's kernel rows and reconciliations (of ``machine``, else of each machine) to
    ``folder/kernels-<machine>.csv`` and ``folder/reconcile-<machine>.csv``."""
    from modak.errors import InputError
    from modak.measurements.kernels import KERNEL_CSV, RECONCILE_CSV, write_kernel_csv, write_reconcile_csv
    from modak.measurements.store import PerfStore

    where = {} if machine is None else {"machine": machine}
    with PerfStore(store) as perf:
        kernels, reconciled = perf.kernel_rows(**where), perf.reconciliations(**where)
        path = perf.path
    machines = sorted({r.machine for r in kernels} | {r.machine for r in reconciled})
    if not machines:
        raise InputError(f"no kernel rows{f' of {machine}' if machine else ''} (run `modak bench --kernels`)",
                         path)
    files: list[tuple[Path, int]] = []
    for name in machines:
        written = folder / KERNEL_CSV.format(machine=name)
        files.append((written, write_kernel_csv(written, (r for r in kernels if r.machine == name))))
        written = folder / RECONCILE_CSV.format(machine=name)
        files.append((written, write_reconcile_csv(written, (r for r in reconciled if r.machine == name))))
    return KernelFiles(path, tuple(files))


def analyze(job: str | Path, target: str | Path | None = None) -> WorkloadProfile:
    """The job's model analysed at its batch size: per-operator FLOPs and bytes (``modak analyze``)."""
    from modak.workload.source import load_analysis

    return load_analysis(load(job, target))[1]


def schemas() -> dict[str, dict]:
    """The JSON Schemas of the Job and Target specs, by kind (``job``, ``target``)."""
    import msgspec

    from modak.spec.models import Job
    from modak.spec.target import Target

    def schema(model: type) -> dict:
        (root,), definitions = msgspec.json.schema_components([model])
        return {**definitions.pop(model.__name__), "$defs": definitions}

    return {"job": schema(Job), "target": schema(Target)}


def document_schemas() -> dict[str, dict]:
    """The JSON Schemas of the documents modak prints (``--json``) and writes, generated from their typed records,
    by name (``modak/schemas/NAME.schema.json`` ships them; ``modak schema NAME`` prints one)."""
    from modak.documents import analysis, build, check, evaluation, generated_schema, pack, render, scale, whatif
    from modak.documents import plan as plan_document
    from modak.measurements.store import BENCH_SCHEMA, Measurement

    roots: list[tuple[Any, tuple[str, str, str]]] = [
        (analysis.AnalysisDocument, analysis.SCHEMA), (list[Measurement], BENCH_SCHEMA),
        (build.BuildDocument, build.SCHEMA), (check.CheckDocument, check.SCHEMA),
        (check.BaselineDocument, check.BASELINE_SCHEMA), (evaluation.EvaluationDocument, evaluation.SCHEMA),
        (pack.PackDocument, pack.SCHEMA), (plan_document.PlanDocument, plan_document.SCHEMA),
        (render.RenderDocument, render.SCHEMA), (scale.ScaleDocument, scale.SCHEMA),
        (whatif.WhatIfDocument, whatif.SCHEMA)]
    return {schema[0]: generated_schema(root, *schema) for root, schema in roots}


def tune(plan: Plan, settings: TuneSettings, dispatch: str = "local", store: Path | None = None,
         on_launch: Callable[[Candidate, dict], None] | None = None,
         on_round: Callable[[int, list[str], list[str]], None] | None = None) -> TuneResult:
    """Race the plan's shortlist on its target (``dispatch``: ``local`` runs launches here, a scheduler of
    :func:`modak.bench.dispatch.dispatch_names` as its job arrays on the target's partition) and record the winner
    in the perf store for :func:`plan_job` and :func:`build`. Ctrl-C keeps the launches measured."""
    from modak.bench import dispatch as dispatchers
    from modak.bench.tune import tune as race
    from modak.measurements.store import PerfStore

    dispatcher = dispatchers.dispatcher(dispatch, plan.loaded.target.scheduler.partition)
    with PerfStore(store) as perf:
        return race(plan, perf, settings, dispatcher, on_launch=on_launch, on_round=on_round)


@dataclass(frozen=True)
class ModelFit:
    """What :func:`fit_model` fitted the learned model on, and how long it took."""

    rows: int  # rows fitted on
    local: int  # of them, rows of the local perf store
    contended: int  # rows left out: measured beside other work
    seconds: float
    coverage: tuple[tuple[str, int], ...]  # runtime/device/precision and its rows


@dataclass(frozen=True)
class ModelEvaluation:
    """What :func:`evaluate_model` cross-validated on and its scores."""

    rows: int
    models: int
    machines: tuple[str, ...]
    scored: int  # rows held out and scored (all, or ``machine``'s)
    machine: str | None
    scores: tuple[Scores, ...]


def _measured_rows(store: Path | None) -> tuple[TrainingData, Sequence[Measurement], Sequence[float],
                                                  list[Measurement]]:
    """The learned model's training data, its rows and their weights, and the rows that measured a step time."""
    from modak.errors import InputError
    from modak.predict.training import ok_rows, training_set

    data = training_set(store)
    rows, weights = data.load()
    usable = ok_rows(rows)
    if not usable:
        raise InputError("no measured rows: ship perfmodels/*.csv or run `modak bench` first")
    return data, rows, weights, usable


def fit_model(store: Path | None = None) -> ModelFit:
    """Refit the learned model on the shipped measurements and the local ``store``, and cache it for planning."""
    import time

    from modak.predict.learned import LearnedPredictor

    data, rows, weights, usable = _measured_rows(store)
    start = time.perf_counter()
    model = LearnedPredictor.cached(data, refit=True)
    seconds = time.perf_counter() - start
    used = {id(r) for r in usable}
    coverage = tuple((f"{runtime}/{device}/{precision}",
                      sum((r.runtime, r.device, r.precision) == (runtime, device, precision) for r in usable))
                     for runtime, device, precision in sorted(model.coverage))
    return ModelFit(model.rows, sum(w > 1 for w, r in zip(weights, rows) if id(r) in used),
                    sum(r.status == "contended" for r in rows), seconds, coverage)


def evaluate_model(store: Path | None = None, seeds: int = 1, machine: str | None = None,
                   split: str | None = None) -> ModelEvaluation:
    """Cross-validate the forest fit with seeds ``0 .. seeds - 1``, the kernel model with the forest as its fallback
    at the same seeds (where there are kernel rows, shipped or in ``store``), the same corrected by each workload's
    runs, and the baseline (:func:`modak.predict.evaluate.default_predictors`); ``machine``: hold out and score only
    that target's rows; ``split``: only that split (:data:`modak.predict.evaluate.SPLITS`)."""
    from modak.errors import InputError
    from modak.predict.evaluate import SPLITS, default_predictors, evaluate
    from modak.predict.training import kernel_set

    if seeds < 1:
        raise InputError(f"--seeds {seeds}: give a positive number of seeds")
    if split is not None and split not in SPLITS:
        raise InputError(f"--split {split}: expected one of {', '.join(SPLITS)}")
    _, _, _, usable = _measured_rows(store)
    kernel_data = kernel_set(store)
    kernels = None if kernel_data is None else kernel_data.load()
    machines = tuple(sorted({r.machine for r in usable}))
    if machine is not None and machine not in machines:
        raise InputError(f"--machine {machine}: no measured rows of that target (there are: {', '.join(machines)})")
    return ModelEvaluation(len(usable), len({r.model for r in usable}), machines,
                           sum(machine in (None, r.machine) for r in usable), machine,
                           tuple(evaluate(usable, default_predictors(seeds, kernels=kernels), machine, only=split)))


@dataclass(frozen=True)
class Probed:
    """A probe of this machine: its result, the Target document made of it, where it was cached (None: it did not
    run alone) and the Target file written (None: none asked for)."""

    result: ProbeResult
    target: dict
    cached: Path | None
    written: Path | None
    kernels: KernelProbe | None = None  # modak probe --kernels: what it measured


@dataclass(frozen=True)
class KernelProbe:
    """What ``modak probe --kernels`` stored: kernel rows and reconciliations under each machine name in
    ``machines`` (target ``local``'s, and a written Target file's), the layers measured, the zoo's layers drawn
    from, and the per-kind error of each adaptive round."""

    store: Path
    machines: tuple[str, ...]
    rows: int
    reconciliations: int
    layers: int
    drawn_from: int
    errors: tuple[dict[tuple[str, str], float], ...]


def probe(quick: bool = False, name: str | None = None, output: Path | None = None, kernels: bool = False,
          budget_min: float | None = None, store: Path | None = None,
          models: Sequence[str] | None = None, runtimes: Sequence[str] | None = None) -> Probed:
    """Measure this machine's ceilings, cache them as target ``local`` and, with ``output``, write a Target file
    named ``name`` (default: the host name). With ``kernels``, then probe its kernels within ``budget_min`` minutes
    (:func:`modak.bench.kprobe.probe_kernels`: zoo ``models``, ``runtimes``; default all) into the perf ``store``,
    as target ``local``'s rows and, with ``output``, the written target's too."""
    import platform

    import yaml

    from modak.hardware.local import store_probe
    from modak.hardware.probe import probe as measure
    from modak.hardware.probe import probe_comment, to_target
    from modak.paths import write_atomic
    from modak.spec.loader import validate
    from modak.spec.target import Target

    result = measure(quick=quick)
    name = name or "".join(c if c.isalnum() or c in "._-" else "-" for c in platform.node()) or "this-machine"
    target = to_target(result, name)
    validate(target, Target)  # what we write must load
    cached = store_probe(result)
    if output:
        write_atomic(output, probe_comment(result) + yaml.safe_dump(target, sort_keys=False))
    probed = (probe_kernels(budget_min, store, (name,) if output else (), models, runtimes, result)
              if kernels else None)
    return Probed(result, target, cached, output, probed)


def probe_kernels(budget_min: float | None = None, store: Path | None = None, also: Sequence[str] = (),
                  models: Sequence[str] | None = None, runtimes: Sequence[str] | None = None,
                  measured: ProbeResult | None = None) -> KernelProbe:
    """This machine's kernel rows (:func:`modak.bench.kprobe.probe_kernels`), each layer planned on target
    ``local`` (the roofline ranks its candidates), stored under ``local`` and each name of ``also``. With
    ``measured``, a probe of this machine just taken, the layers are planned on a target ``local`` of its ceilings
    (a probe that did not run alone is not cached, and target ``local`` would probe again for each layer)."""
    import tempfile
    from dataclasses import replace

    import yaml

    from modak.bench.kprobe import DEFAULT_BUDGET_MIN, probe_runtimes
    from modak.bench.kprobe import probe_kernels as measure
    from modak.hardware.probe import to_target
    from modak.measurements.store import PerfStore, default_store_path
    from modak.predict.roofline import RooflinePredictor

    path = store or default_store_path()
    roofline = RooflinePredictor()
    with PerfStore(path) as perf, tempfile.TemporaryDirectory(prefix="modak-probe-") as scratch:
        target: str | Path = "local"
        if measured is not None:
            target = Path(scratch) / "local.yaml"
            target.write_text(yaml.safe_dump(to_target(measured, "local"), sort_keys=False), encoding="utf-8")
        done = measure(lambda job: plan_loaded(load(job, target), roofline),
                       perf, DEFAULT_BUDGET_MIN if budget_min is None else budget_min, models,
                       probe_runtimes() if runtimes is None else runtimes)
        for machine in also:
            perf.add_kernels([replace(r, machine=machine) for r in done.rows],
                             [replace(r, machine=machine) for r in done.reconciliations])
    machines = tuple(dict.fromkeys((*(r.machine for r in done.rows), *also)))
    return KernelProbe(path, machines, len(done.rows), len(done.reconciliations), len(done.measured),
                       done.drawn_from, tuple(done.errors))


def check(plan: Plan, baseline: Path, threshold: float | None = None, measured: Path | None = None,
          update: bool = False) -> CheckResult:
    """Compare the plan's choice (and ``measured``, ``modak bench --json`` output) with the baseline file, allowing
    a slowdown of ``threshold`` (default :data:`modak.integrations.check.DEFAULT_THRESHOLD`); with ``update``,
    write the current state as the new baseline."""
    from modak.integrations.check import DEFAULT_THRESHOLD
    from modak.integrations.check import check as compare

    return compare(plan.to_dict(), baseline, DEFAULT_THRESHOLD if threshold is None else threshold, measured, update)


def scale(plan: Plan, max_workers: int | None = None, measured: dict[int, float] | None = None) -> ScaleAdvice:
    """Data-parallel training of the plan's choice on 1..N workers and the largest N that keeps the job's
    ``min_efficiency``; ``measured``: seconds per step by worker count, which the model fits."""
    from modak.scaling import advise

    return advise(plan, max_workers=max_workers, measured=measured or {},
                  single_node=plan.loaded.target.scheduler.kind == "none")


def report(job: str | Path, output: Path, target: str | Path | None = None, predictor_name: PredictorName = "default",
           store: Path | None = None) -> Plan:
    """Plan the job and write its self-contained HTML report (rooflines, trajectory, ranked table) to ``output``;
    the plan."""
    from modak.report import write_report

    # The report re-predicts the chosen candidate at other batches and threads: it needs the plan's predictor.
    using = predictor(predictor_name, store)
    plan = plan_job(job, target, store=store, using=using)
    write_report(plan, using, output, store)
    return plan


def zoo() -> list[ZooEntry]:
    """The reference architectures of the model zoo."""
    from modak.image.zoo import ZOO

    return list(ZOO.values())


def whatif(job: str | Path, targets: Sequence[str | Path], predictor_name: PredictorName = "default",
           store: Path | None = None, using: Predictor | None = None) -> WhatIf:
    """The job planned on each target (its own ``target`` replaced by each), ranked by its objective, with the
    Pareto front of time against cost (:mod:`modak.advise.whatif`)."""
    from modak.advise.whatif import whatif as rank

    using = using or predictor(predictor_name, store)
    return rank([(Path(t), plan_loaded(load(job, t), using, store)) for t in targets])


def whatif_report(result: WhatIf, output: Path) -> Path:
    """Write the what-if's self-contained HTML report, with its plot of time against cost, to ``output``."""
    from modak.report.whatif import write_whatif_report

    return write_whatif_report(result.to_dict(), output)


def pack(jobs: Sequence[str | Path], target: str | Path, predictor_name: PredictorName = "default",
         store: Path | None = None, modes: Sequence[str] | None = None, using: Predictor | None = None) -> PackResult:
    """Co-location advice: which of ``jobs`` can share a node or GPU of ``target`` by one of ``modes`` (default:
    every way of sharing), each one's predicted slowdown and the aggregate throughput (:mod:`modak.advise.pack`)."""
    from modak.advise.pack import pack as arrange
    from modak.render.sharing import SHARING_MODES

    using = using or predictor(predictor_name, store)
    return arrange([(Path(job), load(job, target)) for job in jobs], lambda loaded: plan_loaded(loaded, using, store),
                   tuple(SHARING_MODES) if modes is None else modes)


def render_pack(result: PackResult, out_dir: Path) -> list[Path]:
    """Render every packed job into ``out_dir/<job>/``: with its share's plan and sharing settings when its group
    shares, else its plan alone; and ``out_dir/pack.json``, the decision. The folders written."""
    import json

    from modak.paths import write_atomic

    written = []
    for group in result.groups:
        if group.chosen is None:
            for job in group.jobs:
                render_plan(job.alone, out_dir / job.label)
                written.append(out_dir / job.label)
            continue
        for placement in group.chosen.placements:
            assert placement.plan is not None
            render_plan(placement.plan, out_dir / placement.job.label, placement.sharing)
            written.append(out_dir / placement.job.label)
    write_atomic(out_dir / "pack.json", json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return written
