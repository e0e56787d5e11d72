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
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from modak.bench.harness import BenchSettings
    from modak.build.pipeline import BuildOptions, BuildResult, Progress
    from modak.build.submit import Submission
    from modak.candidates.enumerate import Candidate
    from modak.measurements.store import Measurement, TunedChoice
    from modak.plan import Plan
    from modak.predict.base import Predictor
    from modak.render.ir import BuildDescription, Sharing
    from modak.spec.loader import LoadedJob
    from modak.workload.analysis import WorkloadProfile

PredictorName = Literal["default", "roofline"]


def load(job: str | Path, target: str | Path | None = None) -> LoadedJob:
    """The job and its target, validated, with every file they refer to checked; target ``local`` (and a target
    file's ``cpu: local``) is this machine's cached probe."""
    from modak.hardware.local import local_sections
    from modak.spec.loader import load_job

    return load_job(job, target, local_sections)


def predictor(name: PredictorName = "default", store: Path | None = None) -> Predictor:
    """``default``: the learned model (shipped measurements plus the local ``store``) with the roofline where it
    has no data; ``roofline``: the analytic model alone."""
    from modak.predict.default import default_predictor
    from modak.predict.roofline import RooflinePredictor

    return RooflinePredictor() if name == "roofline" else default_predictor(store)


def plan_job(job: str | Path, target: str | Path | None = None, predictor_name: PredictorName = "default",
             store: Path | None = None, using: Predictor | None = None) -> Plan:
    """Load, resolve and analyse the job, then rank its candidates (``using`` overrides the named predictor). With
    ``model.batch_size: auto``, the plan of the batch size with the most predicted samples per second within the
    limits (:func:`modak.plan.choose_batch`): its job has that batch, and its ``batches`` list every one tried."""
    return plan_loaded(load(job, target), using or predictor(predictor_name, store), store)


def plan_loaded(loaded: LoadedJob, using: Predictor, store: Path | None = None) -> Plan:
    """:func:`plan_job` of a job already loaded (e.g. with its target changed: ``modak whatif``, ``modak pack``)."""
    from modak.plan import choose_batch, make_plan
    from modak.spec.models import AUTO_BATCH
    from modak.workload.source import load_analysis

    def plan_at(concrete: LoadedJob) -> Plan:
        source, workload = load_analysis(concrete)
        tuned, failed = measured_on_target(concrete, workload, store)
        return make_plan(concrete, source, workload, using, tuned=tuned, failed=failed)

    return choose_batch(loaded, plan_at) if loaded.job.model.batch_size == AUTO_BATCH else plan_at(loaded)


def measured_on_target(loaded: LoadedJob, workload: WorkloadProfile,
                       store: Path | None = None) -> tuple[TunedChoice | None, list[Measurement]]:
    """What the perf store holds for this job's workload on its target: the winner ``modak tune`` recorded, if any,
    and the rows whose output failed the reference check (status ``incorrect``)."""
    from modak.measurements.store import PerfStore, as_json, default_store_path
    from modak.plan import workload_identity

    path = store or default_store_path()
    if not path.exists():
        return None, []
    with PerfStore(path) as perf:
        failed = perf.rows(machine=loaded.target.name, model=workload.model_name, task=workload.task.value,
                           batch_size=workload.batch_size, flops=workload.flops, nodes=len(workload.ops),
                           input_shapes=as_json({k: list(v) for k, v in workload.input_shapes.items()}),
                           status="incorrect")
        return perf.tuned(loaded.target.name, workload_identity(loaded, workload)), failed


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
          progress: Progress | None = None) -> BuildResult:
    """Render, build, label, smoke-test and tag the plan's image (and push or archive it, as ``options`` say)."""
    from modak.build.pipeline import BuildOptions, build_job

    return build_job(plan, Path(out_dir) if out_dir else default_output(plan), options or BuildOptions(), progress)


def submit(plan: Plan, out_dir: str | Path | None = None, wait_seconds: float | None = None) -> Submission:
    """Render the plan and submit its job script to the target's scheduler (waiting up to ``wait_seconds``)."""
    from modak.build.submit import submit as submit_script
    from modak.build.submit import wait

    out = (Path(out_dir) if out_dir else default_output(plan)).absolute()
    job = render_plan(plan, out).ir.job
    submission = submit_script(out / "job.sh", job.scheduler, job.log_file)
    if wait_seconds is not None:
        wait(submission, timeout=wait_seconds)
    return submission


def bench(plan: Plan, selection: Sequence[str], settings: BenchSettings, store: Path | None = None,
          on_launch: Callable[[Candidate, dict], None] | None = None) -> tuple[list[Measurement], Path]:
    """Measure the selected candidates (``all``, ``top-K``, names) with the measurement protocol, storing their
    rows in the perf store after every round; the rows and the store's path. Ctrl-C keeps what was measured."""
    from modak.bench.harness import bench as measure
    from modak.bench.harness import select_candidates
    from modak.measurements.store import PerfStore

    with PerfStore(store) as perf:
        rows = measure(plan, select_candidates(plan, list(selection)), perf, settings, on_launch=on_launch)
        return rows, perf.path
