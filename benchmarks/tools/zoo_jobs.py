"""Benchmark-only helpers: plan a zoo workload without a job file, measure candidates side by side."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace

from modak.batching import choose_batch
from modak.bench.harness import BenchSettings, bench
from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.measurements.store import PerfStore
from modak.plan import Plan, make_plan
from modak.predict.base import Predictor
from modak.predict.roofline import RooflinePredictor
from modak.spec.document import SpecDocument
from modak.spec.loader import LoadedJob, validate
from modak.spec.models import AUTO_BATCH, Job
from modak.spec.resolve import resolve_files
from modak.spec.target import Target
from modak.workload.source import load_analysis


def zoo_plan(model: str, batch: int | str, task: str, precision: list[str], target: Target,
             target_doc: SpecDocument, catalog: dict[str, Recipe] | None = None, predictor: Predictor | None = None,
             **job_fields: object) -> Plan:
    """Plan a zoo workload on ``target`` without a job file (campaigns and benchmarks); ``batch`` ``auto``: the
    plan of the batch size :func:`modak.batching.choose_batch` chooses."""
    job = validate({"apiVersion": "modak/v1", "kind": "Job", "name": f"{model}-{task}-b{batch}", "task": task,
                    "model": {"zoo": model, "batch_size": batch}, "precision": precision, **job_fields}, Job)
    job_doc = SpecDocument(target_doc.path)
    loaded = LoadedJob(job, target, job_doc, target_doc, resolve_files(job, target, job_doc, target_doc))

    def plan_at(concrete: LoadedJob) -> Plan:
        return make_plan(concrete, *load_analysis(concrete), predictor or RooflinePredictor(), catalog)

    return choose_batch(loaded, plan_at) if batch == AUTO_BATCH else plan_at(loaded)


def measure_rounds(plan: Plan, candidates: dict[str, Candidate], rounds: int, settings: BenchSettings,
                   store: PerfStore) -> dict[str, list[float]]:
    """Each labelled candidate's launch medians over ``rounds`` interleaved rounds of the harness (random order in
    every round, so time ``i`` of two candidates ran in the same round); empty for a candidate that failed."""
    rows = bench(plan, list(candidates.values()), store, replace(settings, launches=rounds))
    by_name = {c.name: r for c, r in zip(candidates.values(), rows)}
    return {label: json.loads(by_name[c.name].launch_medians or "[]") if c.name in by_name else []
            for label, c in candidates.items()}


def measure_side_by_side(plan: Plan, candidates: dict[str, Candidate], rounds: int,
                         settings: BenchSettings, store: PerfStore) -> dict[str, float | None]:
    """Median step time of each labelled candidate over :func:`measure_rounds`; None for one that never ran."""
    return {label: statistics.median(values) if values else None
            for label, values in measure_rounds(plan, candidates, rounds, settings, store).items()}


def stock_candidate(plan: Plan) -> Candidate:
    """The stock deployment of the plan (PyTorch eager, fp32, framework defaults: the recipe marked ``stock``)."""
    if plan.stock is None:
        raise ValueError(f"the plan for {plan.workload.model_name} has no stock candidate")
    return plan.stock.candidate


def measure_plans(pairs: dict[str, tuple[Plan, Candidate]], rounds: int, settings: BenchSettings,
                  store: PerfStore, seed: int = 0) -> dict[str, float | None]:
    """Median step time of each labelled (plan, candidate), for candidates of different plans (e.g. other batch
    sizes): one launch each per round, the labels in a new random order every round; None for one that failed."""
    order, times = list(pairs), {label: [] for label in pairs}
    shuffle = random.Random(seed).shuffle
    for _ in range(rounds):
        shuffle(order)
        for label in order:
            plan, candidate = pairs[label]
            rows = bench(plan, [candidate], store, replace(settings, launches=1))
            times[label] += json.loads(rows[0].launch_medians or "[]") if rows and rows[0].step_median_s else []
    return {label: statistics.median(values) if values else None for label, values in times.items()}
