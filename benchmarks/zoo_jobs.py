"""Benchmark-only helpers: plan a zoo workload without a job file, measure candidates side by side."""

from __future__ import annotations

import statistics

from modak.bench.harness import BenchSettings, bench
from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.measurements.store import PerfStore
from modak.plan import Plan, make_plan
from modak.predict.base import Predictor
from modak.predict.roofline import RooflinePredictor
from modak.spec.document import SpecDocument
from modak.spec.loader import LoadedJob
from modak.spec.models import Job, Target
from modak.spec.resolve import resolve_files
from modak.workload.source import load_analysis


def zoo_plan(model: str, batch: int, task: str, precision: list[str], target: Target, target_doc: SpecDocument,
             catalog: dict[str, Recipe] | None = None, predictor: Predictor | None = None,
             **job_fields: object) -> Plan:
    """Plan a zoo workload on ``target`` without a job file (campaigns and benchmarks)."""
    job = Job.model_validate({"apiVersion": "modak/v1", "kind": "Job", "name": f"{model}-{task}-b{batch}",
                              "task": task, "model": {"zoo": model, "batch_size": batch}, "precision": precision,
                              **job_fields})
    job_doc = SpecDocument(target_doc.path)
    loaded = LoadedJob(job, target, job_doc, target_doc, resolve_files(job, target, job_doc, target_doc))
    return make_plan(loaded, *load_analysis(loaded), predictor or RooflinePredictor(), catalog)


def measure_rounds(plan: Plan, candidates: dict[str, Candidate], rounds: int, settings: BenchSettings,
                   store: PerfStore) -> dict[str, list[float | None]]:
    """Each labelled candidate's median step time in each of ``rounds`` rounds, measured in alternation so that
    machine noise hits all alike (time ``i`` of two candidates ran in the same round; None: that run failed)."""
    times: dict[str, list[float | None]] = {label: [] for label in candidates}
    for _ in range(rounds):
        for label, candidate in candidates.items():
            times[label].append(bench(plan, [candidate], store, settings)[0].step_median_s or None)
    return times


def measure_side_by_side(plan: Plan, candidates: dict[str, Candidate], rounds: int,
                         settings: BenchSettings, store: PerfStore) -> dict[str, float | None]:
    """Median step time of each labelled candidate over :func:`measure_rounds`; None for one that never ran."""
    medians: dict[str, float | None] = {}
    for label, values in measure_rounds(plan, candidates, rounds, settings, store).items():
        ran = [t for t in values if t is not None]
        medians[label] = statistics.median(ran) if ran else None
    return medians


def stock_candidate(plan: Plan) -> Candidate:
    """The stock deployment of the plan (PyTorch eager, fp32, framework defaults: the recipe marked ``stock``)."""
    if plan.stock is None:
        raise ValueError(f"the plan for {plan.workload.model_name} has no stock candidate")
    return plan.stock.candidate
