"""`modak pack`'s GPU sharing model against published figures.

    python -m benchmarks.published.share_published [--data perfmodels/published/gpu_sharing.csv] [--tolerance 15]

Every row of ``perfmodels/published/gpu_sharing.csv`` is a published point (source, where in it, and the quote):
a job's slowdown when n jobs share one GPU (by MPS, MIG slices or time-slicing) against the job alone, or one MIG
slice's throughput against the whole GPU's. The sharing model (``modak.advise.contention``, with the MIG slices of
``modak.advise.pack``) predicts each from the row's facts alone, through its own functions:

* MIG slices isolate (``gpu_arrangements`` adds no term between slices): a job beside busy slices keeps its step
  on its slice, where the n slices fit the GPU (``mig_profiles``, ``slices_fit``);
* a slice's throughput: the row's zoo model planned at the row's batch on one GPU of the catalog model (or on the
  row's ``alone_profile``, the 7-slice instance) and on the slice (``mig_target``: its share of the SMs, memory
  bandwidth and memory), batch / step of each;
* MPS and time-slicing: n copies of the job's load (``load_of`` its plan on the GPU: the share of its step the
  GPU runs its kernels) through ``mps_slowdowns`` and ``gpu_time_sliced_slowdowns``.

Nothing is fitted in the first table. Rows whose workload is not in modak's zoo get no load there; the second
table fits that load's GPU utilization to one MPS row of the same setup (a row marked ``calibration``: for n
identical jobs the MPS model gives max(1, n u)) and predicts the setup's other rows with it. Errors are relative to
the published figure; 15% is the target of ``benchmarks/models/pack.py``. The script reports; it does not fail when
points miss the tolerance (exit 0 unless the data cannot be read).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from modak import api
from modak.advise.contention import Load, gpu_time_sliced_slowdowns, load_of, mps_slowdowns
from modak.advise.pack import MigProfile, mig_profiles, mig_target, slices_fit
from modak.paths import data_dir
from modak.plan import Plan
from modak.predict.base import Predictor

DATA = data_dir("perfmodels") / "published" / "gpu_sharing.csv"
TOLERANCE = 15.0  # percent: the target of benchmarks/models/pack.py
SECONDS = "s per inference"  # each job's time per step
PER_JOB = "samples/s"  # each job's throughput
ALL_JOBS = "samples/s, all jobs"  # the n jobs' throughput together
# The host of every planned row: the DGX-A100's, 'AMD EPYC 7742', 2 processors of 64 cores (MLPerf's system
# description); a GPU plan's step does not depend on it.
HOST = {"microarchitecture": "zen2", "sockets": 2, "cores_per_socket": 64}


@dataclass(frozen=True)
class Point:
    """One published row."""

    row: dict[str, str]

    @property
    def name(self) -> str:
        return self.row["point"]

    @property
    def jobs(self) -> int:
        return int(self.row["jobs"])

    @property
    def mode(self) -> str:
        return self.row["mode"]

    @property
    def metric(self) -> str:
        return self.row["metric"]

    @property
    def published(self) -> float:
        """The slowdown (shared step / alone step) or the slice's share of the whole GPU's throughput."""
        alone, shared, unit = float(self.row["alone"]), float(self.row["shared"]), self.row["unit"]
        if self.metric == "slice_throughput":
            return alone / shared if unit == SECONDS else shared / alone
        if unit == SECONDS:
            return shared / alone
        return self.jobs * alone / shared if unit == ALL_JOBS else alone / shared

    @property
    def profile(self) -> MigProfile:
        return self._profile(self.row["profile"])

    @property
    def alone_profile(self) -> MigProfile | None:
        """The slice the job ran on alone (None: the whole GPU, MIG off)."""
        return self._profile(self.row["alone_profile"]) if self.row["alone_profile"] else None

    def _profile(self, name: str) -> MigProfile:
        return next(p for p in mig_profiles(self.row["modak_gpu"]) if p.name == name)

    def gain(self, value: float) -> str:
        """The aggregate throughput over the jobs one after another on the whole GPU: n / slowdown (MPS,
        time-slicing); for a slice, the GPU filled with slices of its profile (instances x the slice's share, the
        slices isolated); none for a MIG slowdown (its jobs alone ran on a slice, not on the whole GPU)."""
        if self.metric == "slice_throughput":
            return f"{self.profile.instances * value:.2f}"
        return "" if self.mode == "mig" else f"{self.jobs / value:.2f}"


def load(path: Path) -> list[Point]:
    with path.open(newline="") as handle:
        points = [Point(row) for row in csv.DictReader(handle)]
    for point in points:
        assert point.row["unit"] in (SECONDS, PER_JOB, ALL_JOBS), f"{point.name}: unit {point.row['unit']!r}"
    return points


class Planner:
    """Plans a row's zoo model on one GPU of its catalog model, or on a MIG slice of it, each once."""

    def __init__(self, predictor: Predictor, folder: Path) -> None:
        self.predictor, self.folder = predictor, folder
        self._plans: dict[tuple[str, ...], Plan] = {}

    def plan(self, point: Point, batch: int, profile: MigProfile | None = None) -> Plan:
        row = point.row
        key = (row["zoo"], row["input_shape"], row["task"], str(batch), row["modak_precision"], row["modak_gpu"],
               profile.name if profile else "")
        if key not in self._plans:
            loaded = api.load(self._job(row, batch), self._target(row["modak_gpu"]))
            plan = api.plan_loaded(loaded, self.predictor)
            if profile is not None:
                plan = api.plan_loaded(replace(loaded, target=mig_target(loaded.target, plan, profile)), self.predictor)
            self._plans[key] = plan
        return self._plans[key]

    def _job(self, row: dict[str, str], batch: int) -> Path:
        name = f"{row['zoo']}-{row['task']}-b{batch}-{row['modak_precision']}".replace("_", "-")
        model: dict[str, object] = {"zoo": row["zoo"], "batch_size": batch}
        if row["input_shape"]:
            model["input_shape"] = [int(d) for d in row["input_shape"].split("x")]
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "modak/v1", "kind": "Job", "name": name, "task": row["task"], "device": "gpu",
            "model": model, "precision": [row["modak_precision"]]}))
        return path

    def _target(self, gpu: str) -> Path:
        path = self.folder / f"{gpu}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "modak/v1", "kind": "Target", "name": gpu.lower(), "cpu": HOST,
            "memory": {"size_gb": 1024}, "gpus": {"model": gpu, "count": 1}}))
        return path


def throughput(plan: Plan) -> float:
    return plan.workload.batch_size / plan.choice.prediction.step_seconds


def shared_slowdown(mode: str, load: Load, jobs: int, bandwidth_gbs: float) -> float:
    """One of ``jobs`` identical loads' slowdown under MPS or time-slicing."""
    loads = [load] * jobs
    return (mps_slowdowns(loads, bandwidth_gbs) if mode == "mps" else gpu_time_sliced_slowdowns(loads))[0]


def isolated(point: Point) -> float | None:
    """MIG: the job keeps its step beside busy slices (1.0) where the row's slices fit the GPU."""
    return 1.0 if slices_fit([point.profile] * point.jobs) else None


def modelled(point: Point, planner: Planner) -> tuple[float, float | None] | None:
    """The model's figure for the row from its facts alone, with the job's GPU utilization alone (on the whole GPU
    or its ``alone_profile``) where a plan gives it (None: the row's workload is not in modak's zoo)."""
    if point.mode == "mig" and point.metric == "slowdown":
        value = isolated(point)
        return None if value is None else (value, None)
    if not point.row["zoo"]:
        return None
    if point.metric == "slice_throughput":
        whole = planner.plan(point, int(point.row["batch_alone"]), point.alone_profile)
        part = planner.plan(point, int(point.row["batch_shared"]), point.profile)
        return throughput(part) / throughput(whole), load_of(whole).gpu_utilization
    plan = planner.plan(point, int(point.row["batch_alone"]))
    gpu = plan.ceilings.gpu
    assert gpu is not None
    job = load_of(plan)
    return shared_slowdown(point.mode, job, point.jobs, gpu.bandwidth_gbs), job.gpu_utilization


def fitted(anchor: Point) -> Load:
    """The load whose MPS slowdown for the anchor's n identical jobs, max(1, n u), is its published slowdown (the
    memory term left out: the rows give no bandwidth draw)."""
    assert anchor.mode == "mps" and anchor.metric == "slowdown" and anchor.published > 1, anchor.name
    return Load(anchor.name, 1.0, 0.0, anchor.published / anchor.jobs, 0.0, 0.0)


def error(predicted: float, published: float) -> float:
    """The relative error (%) of the prediction."""
    return (predicted / published - 1.0) * 100


def _line(point: Point, predicted: float, utilization: float | None, tolerance: float) -> tuple[str, bool]:
    err = error(predicted, point.published)
    ok = abs(err) <= tolerance
    u = "" if utilization is None else f"{utilization:.2f}"
    return (f"{point.name:34} {point.mode:12} {point.jobs:2d} {point.metric:16} {point.published:9.3f} "
            f"{predicted:9.3f} {err:+7.1f}%  {point.gain(point.published):>6} {point.gain(predicted):>6} "
            f"{u:>5}  {'yes' if ok else 'NO'}"), ok


HEADER = (f"{'point':34} {'mode':12} {'n':>2} {'metric':16} {'published':>9} {'predicted':>9} {'error':>8}  "
          f"{'gain p':>6} {'gain m':>6} {'u':>5}  within")


def report(points: list[Point], planner: Planner, tolerance: float, out: Callable[[str], None] = print) -> int:
    """The model alone on every row it has inputs for; the number within ``tolerance``."""
    out("modak's sharing model from each row's facts (nothing fitted); slowdown: shared step / alone step; "
        "slice_throughput: the slice's throughput / the whole GPU's; gain: published (p) and modelled (m) aggregate "
        "throughput over the jobs one after another on the whole GPU (a slice: the GPU filled with slices of its "
        "profile); u: the share of the job's planned step alone that its kernels run (the rest: launch overhead)")
    out(HEADER)
    within = compared = 0
    left_out = []
    for point in points:
        result = None if point.row["role"] == "excluded" else modelled(point, planner)
        if result is None:
            left_out.append(point)
            continue
        line, ok = _line(point, *result, tolerance)
        out(line)
        within += ok
        compared += 1
    for point in left_out:
        out(f"{point.name:34} not compared: {point.row['notes']}")
    out(f"{within}/{compared} points within {tolerance:g}% (the target of benchmarks/models/pack.py), "
        f"model alone, nothing fitted; {len(left_out)} rows left out (their workload is not in modak's zoo)")
    return within


def calibrated(points: list[Point], tolerance: float, out: Callable[[str], None] = print) -> int:
    """The rows of a setup whose workload modak cannot plan, with the GPU utilization fitted to its calibration row;
    the number of held-out rows within ``tolerance``."""
    named = {p.name: p for p in points}
    anchors = {p.row["calibrate_on"] for p in points if p.row["calibrate_on"]}
    out(f"\nthe job's GPU utilization u fitted to one MPS row of its setup (calibration: "
        f"{', '.join(sorted(anchors))}), the setup's other rows predicted with it:")
    out(HEADER)
    within = total = 0
    for point in points:
        if not point.row["calibrate_on"]:
            continue
        anchor = named[point.row["calibrate_on"]]
        assert anchor.row["role"] == "calibration", anchor.name
        job = fitted(anchor)
        line, ok = _line(point, shared_slowdown(point.mode, job, point.jobs, 0.0), job.gpu_utilization, tolerance)
        out(line)
        within += ok
        total += 1
    out(f"{within}/{total} held-out points within {tolerance:g}% with u fitted to one MPS row per setup")
    return within


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="published points (CSV)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="percent (default 15)")
    args = parser.parse_args()
    points = load(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        report(points, Planner(api.predictor(), Path(tmp)), args.tolerance)
    calibrated(points, args.tolerance)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
