"""One prepared GPU session (#41): plan on this machine, measure on a lent GPU machine in one command.

    PYTHONPATH=$PWD python3 benchmarks/data/gpu_session.py plan [--session .gpu-session] [--dry-run] [--models M ...]
    python3 benchmarks/data/gpu_session.py run [--session .gpu-session] [--out DIR] [--budget 480] [--dry-run]

``plan`` (the CPU machine, the whole of modak) builds the ``modak-runtime`` wheel (:mod:`modak.render.package`),
writes the GPU target (:data:`TARGET`: one H100-SXM, 16 cores), the jobs (:data:`JOBS`: inference of ResNet-50,
BERT-base, MobileNetV2 and YOLO-small at batch 1 and 32, training of ResNet-18 and BERT-small at batch 32; every
architecture is in the zoo) and plans each with modak's planner. The candidates are all of the plan's PyTorch eager
and ``torch.compile`` ones (#68): fp32, TF32, bf16 and fp16 autocast, channels_last on and off for the CNNs, the
GPU levers ``cuda_graphs`` (eager: a captured inference step; compile: ``reduce-overhead``/``max-autotune``) and
``io`` (pinned or pageable host buffers), and compile's modes ``default`` and ``max-autotune-no-cudagraphs``, each
with the GPU model's prediction and regime. Each candidate's ``plan.json`` (its deployment), its row's columns
known before measuring (:func:`modak.bench.harness.measurement_row`) and its priority (:data:`PASSES`) go into
``SESSION/session.json``; each job's whole plan into ``SESSION/jobs/``. The session folder is git-ignored
(``.gitignore``) and travels to the GPU machine by the device tool's ``carry``.

``run`` (the GPU machine: its own Python 3.12 and PyTorch, no network, no pydantic or scikit-learn) uses nothing
of modak but the wheel, which it installs with ``pip install --no-deps --no-index --target`` into a scratch folder
(every launch imports modak from there, never from the checkout), plus one host module loaded by path: the zoo's
ONNX export (:mod:`modak.workload.zoo`, whose imports are all in the wheel); the store's columns come from
``session.json``. In that order, stopping at ``--budget`` seconds from its start:

1. the GPU's ceilings, measured here with torch directly (``modak probe`` is host-side code: its GPU part, the
   same GEMMs and triad, cannot run from the wheel) in a process of its own (``gpu_session.py ceilings``: this
   one never holds a CUDA context beside the launches): GEMM TFLOP/s at fp32 (TF32 off), TF32, bf16 and fp16 of
   8192x8192 matrices, HBM bandwidth (stream triad over 1 GiB arrays), the host link (256 MiB copies each way
   from pinned and pageable memory: the wheel's :func:`modak.image.runtimes.pytorch.host_copy_gbs`, as ``modak
   probe``'s), kernel launch overhead (queued launches of a one-element add, and launch plus synchronize);
2. the ONNX export of each model (the reference the check runs; exported there, so that its weights are those
   the GPU's PyTorch builds from the zoo's seed);
3. every candidate through ``python -m modak.image.launch -- python -m modak.runtime measure`` (what ``modak
   bench`` launches: the same launcher, reference check and timing), one launch each, in :data:`PASSES`: the
   stock deployment (eager fp32) of every job, then each job's best (in the plan's order) eager candidate, compile
   candidate, eager and compile candidates with CUDA graphs, pinned one, TF32 and fp16 ones, then the rest of each
   job in the plan's order, the jobs taking turns, the autotuning mode last. A launch's time, compilation and
   graph capture included (its row's ``compile_s``), counts against the budget; a launch gets at most what is
   left;
4. if time is left (``--sharing-seconds``, default :data:`SHARING_RESERVE_S`, are kept for it): 2, 4 and 8
   processes (:data:`SHARING_PROCESSES`) of each sharing job's stock candidate (launch-bound ResNet-50 b1, then
   YOLO-small b1) sharing the GPU, time-sliced (the default) and under MPS if ``nvidia-cuda-mps-control -d``
   starts (quit again afterwards).

It leaves MIG and the GPU's settings as they are (``nvidia-smi`` is only queried). Into ``--out`` (``$OUT`` on the
GPU machine; at most 8 files come back): ``rows.csv`` (the perf store's columns, one row per launched candidate,
written after every launch), ``sharing.csv`` (the columns of ``perfmodels/published/gpu_sharing.csv``: slowdown of
each of two jobs against the job alone), ``ceilings.json``, ``launches.jsonl`` (every launch's report) and
``log.txt``. ``--dry-run`` runs the same steps on the CPU (``plan --dry-run``: tiny inputs and batches; device
cpu, GEMMs of 256, few timed steps, a budget of 60 s): the rehearsal that ``tests/test_gpu_session.py`` runs.

On the GPU machine (the device tool's ``run``), from the repository root, after ``plan`` here:

    carry: [".gpu-session"]
    timeout_s: 560
    command: PYTHONUNBUFFERED=1 python3 benchmarks/data/gpu_session.py run --out $OUT --budget 480

(``--session`` defaults to ``.gpu-session`` in the repository root.) Afterwards, here: ``import OUT [OUT2 ...]``
writes the rows into ``perfmodels/`` and ``report OUT [OUT2 ...]`` prints what #68 holds them against (the
zero-shot pick against the measured best per job, the best samples/s against the first session's and MLPerf's,
the sharing throughput time-sliced and under MPS per process count, the GPU model's launch term fit
leave-one-model-out) and the commands that follow (``modak model eval --machine``, ``ship_fits``). The budget
counts from the script's start, so the command ends by about 490 s: with the machine's start and the transfers,
about 10.5 of the 15 minutes of device time.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / ".gpu-session"
# The lent machine: one H100 80GB HBM3 (SXM), 16 cores (docs of the device tool). The CPU's microarchitecture is
# not known before the run (its log records /proc/cpuinfo's model name); a GPU plan's step does not depend on it.
TARGET = {"apiVersion": "modak/v1", "kind": "Target", "name": "gpu-h100",
          "cpu": {"microarchitecture": "sapphirerapids", "sockets": 1, "cores_per_socket": 16, "threads_per_core": 1},
          "memory": {"size_gb": 128}, "gpus": {"model": "H100-SXM", "count": 1}}
# (zoo model, task, batch) in the issue's priority order.
JOBS = (("resnet50", "inference", 1), ("resnet50", "inference", 32), ("bert_base", "inference", 1),
        ("bert_base", "inference", 32), ("mobilenet_v2", "inference", 1), ("mobilenet_v2", "inference", 32),
        ("yolo_small", "inference", 1), ("yolo_small", "inference", 32),
        ("resnet18", "training", 32), ("bert_small", "training", 32))
PRECISIONS = ["fp32", "tf32", "bf16", "fp16"]
RUNTIMES = ("pytorch", "torch-compile")
AUTOTUNE = "max-autotune-no-cudagraphs"  # the recipe's autotuning mode (with cuda_graphs: max-autotune): last
# The dry run: the same jobs on small inputs (YOLO's head needs a multiple of 32) and batches 1 and 2.
DRY_SHAPES = {"resnet50": [3, 32, 32], "resnet18": [3, 32, 32], "mobilenet_v2": [3, 32, 32],
              "yolo_small": [3, 64, 64], "bert_base": [16], "bert_small": [16]}
DRY_BATCH = {1: 1, 32: 2}
SHARED_JOBS = (("resnet50", "inference", 1), ("yolo_small", "inference", 1))  # launch-bound (#41's rows), in order
SHARING_PROCESSES = (2, 4, 8)  # processes of it sharing the GPU, time-sliced and under MPS
DRY_SHARING_PROCESSES = (2,)  # the rehearsal's (2 cores)
# The first session's best samples/s (perfmodels/README.md, "gpu-h100.csv") and MLPerf Inference v4.0's ResNet-50
# Offline on one H100-SXM (TensorRT, int8): what the report holds the new rows against.
FIRST_SESSION_BEST = {"resnet50-inference-b32": 32 / 4.172e-3, "resnet50-inference-b1": 1 / 3.220e-3,
                      "bert_base-inference-b32": 32 / 7.071e-3, "yolo_small-inference-b32": 32 / 55.104e-3}
MLPERF_RESNET50_OFFLINE = 88714.0
SHARING_COLUMNS_FILE = ROOT / "perfmodels" / "published" / "gpu_sharing.csv"
# The device tool's call (:func:`device_call`): run's budget, and the command's limit above it (the last launch's
# end, MPS's quit, the writes).
DEVICE_BUDGET_S = 480
SHARING_RESERVE_S = 120.0  # of it, kept for the sharing step (2, 4, 8 processes, time-sliced and MPS: ~15 s each)
DEVICE_TIMEOUT_S = 560


@dataclass(frozen=True)
class Settings:
    """What ``run`` does: :data:`GPU` on the GPU machine, :data:`DRY_RUN` on the CPU."""

    device: str  # the launches' device (the deployments' is gpu)
    gemm_n: int  # the ceilings' square GEMMs
    triad_elements: int  # fp32 elements of each triad array
    launches: int  # the launch-overhead probe's kernels
    min_seconds: float  # `modak measure --min-seconds` of one launch
    measure_budget: float  # `modak measure --budget`
    share_seconds: float  # timed seconds of each of two sharing processes
    launch_limit: float  # one launch at most (compilation included)


GPU = Settings("gpu", 8192, 1 << 28, 20000, 0.5, 2.0, 4.0, 150.0)
DRY_RUN = Settings("cpu", 256, 1 << 20, 1000, 0.05, 0.2, 0.5, 60.0)


# ---------------------------------------------------------------------------------------------------- plan (host)


def job_id(zoo: str, task: str, batch: int) -> str:
    return f"{zoo}-{task}-b{batch}"


def plan_session(session: Path, dry_run: bool, models: list[str] | None) -> dict[str, Any]:
    """Write the session folder (wheel, target, jobs, plans, ``session.json``); the manifest."""
    import yaml

    from modak import api
    from modak.bench.harness import measurement_row
    from modak.measurements.store import COLUMNS
    from modak.render.package import build_wheel

    if session.exists():
        shutil.rmtree(session)
    (session / "jobs").mkdir(parents=True)
    (session / "candidates").mkdir()
    wheel = build_wheel(session / "wheel")
    target = session / "target.yaml"
    target.write_text(yaml.safe_dump(TARGET, sort_keys=False))
    jobs, candidates = [], []
    for zoo, task, full_batch in JOBS:
        if models and zoo not in models:
            continue
        batch = DRY_BATCH[full_batch] if dry_run else full_batch
        name = job_id(zoo, task, batch)
        model: dict[str, Any] = {"zoo": zoo, "batch_size": batch}
        if dry_run:
            model["input_shape"] = DRY_SHAPES[zoo]
        job = session / "jobs" / f"{name}.yaml"
        job.write_text(yaml.safe_dump({
            "apiVersion": "modak/v1", "kind": "Job", "name": name, "target": "../target.yaml", "task": task,
            "model": model, "precision": PRECISIONS, "device": "gpu", "constraints": {"runtimes": list(RUNTIMES)}},
            sort_keys=False))
        plan = api.plan_job(job)
        (session / "jobs" / f"{name}.plan.json").write_text(json.dumps(plan.to_dict(), indent=1, sort_keys=True))
        chosen = [(r.candidate, r.prediction) for r in plan.ranked]  # the levers are the plan's own (#68)
        plan_rank = {r.candidate: rank for rank, r in enumerate(plan.ranked, 1)}
        entries = []
        for number, (candidate, prediction) in enumerate(chosen):
            key = f"{name}-{number:03d}"
            deployment = plan.deployment(candidate).to_dict()
            (session / "candidates" / f"{key}.json").write_text(json.dumps({"deployment": deployment},
                                                                          sort_keys=True))
            row = measurement_row(plan, candidate, {})
            entries.append({"id": key, "job": name, "name": candidate.name, "runtime": candidate.runtime,
                            "mode": candidate.param("mode"), "stock": plan.recipe(candidate).is_stock(candidate),
                            "cuda_graphs": candidate.param("cuda_graphs") is True, "io": candidate.param("io"),
                            "precision": candidate.precision.value,
                            "predicted_step_s": prediction.step_seconds, "regime": prediction.regime,
                            "predicted_compile_s": prediction.compile_seconds, "plan_rank": plan_rank.get(candidate),
                            "row": {c: getattr(row, c) for c in COLUMNS}})
        candidates.append(entries)
        jobs.append({"id": name, "zoo": zoo, "task": task, "batch": batch, "plan_choice": plan.choice.candidate.name,
                     "measured_pick": chosen[0][0].name,  # the plan's best of the candidates measured here
                     "input_shapes": {k: list(v) for k, v in plan.source.input_shapes.items()}})
    with SHARING_COLUMNS_FILE.open(newline="") as handle:
        sharing_columns = next(csv.reader(handle))
    manifest = {"dry_run": dry_run, "target": TARGET, "wheel": str(wheel.relative_to(session)),
                "columns": list(COLUMNS), "sharing_columns": sharing_columns, "jobs": jobs,
                "candidates": prioritized(candidates),
                "sharing": [job_id(z, t, DRY_BATCH[b] if dry_run else b) for z, t, b in SHARED_JOBS
                            if not models or z in models],
                "sharing_processes": list(DRY_SHARING_PROCESSES if dry_run else SHARING_PROCESSES)}
    (session / "session.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


PASSES = (  # what each job's first candidates are, in the plan's order within each (#68's levers after #41's)
    ("stock", lambda e: e["stock"]),
    ("best eager", lambda e: e["runtime"] == "pytorch"),
    ("best compile", lambda e: e["runtime"] == "torch-compile" and e["mode"] != AUTOTUNE),
    ("eager CUDA graphs", lambda e: e["runtime"] == "pytorch" and e["cuda_graphs"]),
    ("compile CUDA graphs", lambda e: e["runtime"] == "torch-compile" and e["cuda_graphs"] and e["mode"] != AUTOTUNE),
    ("pinned", lambda e: e["io"] == "pinned" and e["mode"] != AUTOTUNE),
    ("tf32", lambda e: e["precision"] == "tf32" and e["mode"] != AUTOTUNE),
    ("fp16", lambda e: e["precision"] == "fp16" and e["mode"] != AUTOTUNE),
)


def prioritized(per_job: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every job's candidates (each list in the plan's order) in passes: each of :data:`PASSES` takes every job's
    first candidate it wants that no earlier pass took; then the rest but the autotuning mode's, the jobs taking
    turns; then those (an autotuning compile alone can take minutes). Each entry gets its ``pass``."""
    left = [list(entries) for entries in per_job]
    order: list[dict[str, Any]] = []
    taken: set[str] = set()
    for number, (_, wanted) in enumerate(PASSES, 1):
        for entries in left:
            found = next((e for e in entries if wanted(e) and e["id"] not in taken), None)
            if found:
                order.append({**found, "pass": number})
                taken.add(found["id"])
    for number, last in ((len(PASSES) + 1, False), (len(PASSES) + 2, True)):
        rest = [[e for e in entries if e["id"] not in taken and (e["mode"] == AUTOTUNE) == last] for entries in left]
        for index in range(max((len(r) for r in rest), default=0)):
            order.extend({**r[index], "pass": number} for r in rest if index < len(r))
    return order


# ---------------------------------------------------------------------------------------------- run (GPU machine)


class Run:
    """One ``run``: the clock, the log, the output files."""

    def __init__(self, session: Path, out: Path, budget_s: float, settings: Settings, reserve_s: float) -> None:
        self.start = time.monotonic()
        self.session, self.out, self.budget_s, self.settings = session, out, budget_s, settings
        self.reserve_s = reserve_s
        self.manifest = json.loads((session / "session.json").read_text())
        self.scratch = Path(tempfile.mkdtemp(prefix="modak-gpu-session-"))
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = (out / "log.txt").open("a", encoding="utf-8")
        self.rows: list[dict[str, Any]] = []
        self.sharing: list[dict[str, Any]] = []
        self.alone: dict[str, dict[str, Any]] = {}  # job -> its stock candidate's entry and result, alone
        self.env = dict(os.environ)
        self.describe: dict[str, Any] = {}  # the machine (:func:`describe_machine`)
        self.machine = ""  # the rows' machine (:func:`machine_name`)
        self.peaks: dict[str, float] = {}  # the probed ceilings (ceilings.json's "peaks"), the rows' columns
        self.id = f"gpu-session-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.start:7.1f} s] {message}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def install(self) -> None:
        """The wheel, with no dependencies and no index, into the scratch folder every launch imports from."""
        site = self.scratch / "site"
        wheel = self.session / self.manifest["wheel"]
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
                   "--disable-pip-version-check", "--target", str(site), str(wheel)]
        subprocess.run(command, check=True, cwd=self.scratch, env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env["MODAK_CACHE"] = str(self.scratch / "cache")
        self.env.pop("MODAK_STORE", None)
        sys.path.insert(0, str(site))
        where = subprocess.run([sys.executable, "-c", "import modak; print(modak.__file__)"], env=self.env,
                               cwd=self.scratch, capture_output=True, text=True).stdout.strip()
        self.log(f"installed {wheel.name} into {site}; launches import modak from {where}")
        if not where.startswith(str(site)):
            raise SystemExit(f"gpu_session: the launches would import modak from {where}, not the wheel")

    def write(self) -> None:
        """rows.csv and sharing.csv as they stand (after every launch: a run cut short keeps its rows)."""
        _write_csv(self.out / "rows.csv", self.manifest["columns"], self.rows)
        if self.sharing:
            _write_csv(self.out / "sharing.csv", self.manifest["sharing_columns"], self.sharing)


def describe_machine() -> dict[str, Any]:
    """Host, CPU, Python, PyTorch and the GPU as PyTorch and ``nvidia-smi`` see them (queried only: MIG, clocks
    and the compute mode stay as they are)."""
    import torch

    facts: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                             "torch": torch.__version__, "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
                             "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 1e9, 1),
                     multiprocessors=props.multi_processor_count, cuda_version=torch.version.cuda)
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,mig.mode.current,clocks.sm,clocks.max.sm,power.limit,compute_mode"
        smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True,
                             text=True, timeout=60)
        facts["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    return facts


def probe_device(run: Run) -> dict[str, Any]:
    """:func:`describe_machine` and :func:`ceilings` in a process of their own (``gpu_session.py ceilings``), so
    that this one never holds a CUDA context or memory beside the launches (nor one MPS would not serve)."""
    command = [sys.executable, str(Path(__file__).resolve()), "ceilings",
               *(["--dry-run"] if run.settings.device == "cpu" else [])]
    try:
        done = subprocess.run(command, env=run.env, cwd=run.scratch, capture_output=True, text=True,
                              timeout=max(run.left(), 30.0))
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as exc:
        stderr = exc.stderr if isinstance(exc, subprocess.TimeoutExpired) else done.stderr
        tail = (stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or "").strip()[-2000:]
        return {"machine": {}, "error": f"{type(exc).__name__}: {tail}"}


def ceilings(settings: Settings) -> dict[str, Any]:
    """The device's GEMM rates per precision, triad bandwidth and kernel launch overhead, with torch directly."""
    import torch

    cuda = settings.device == "gpu"
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def best(fn: Any, runs: int = 5, budget_s: float = 0.4) -> float:
        fn()
        sync()
        fastest, count, deadline = float("inf"), 0, time.perf_counter() + budget_s
        while count < runs or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            fn()
            sync()
            fastest = min(fastest, time.perf_counter() - t0)
            count += 1
            if count >= 200:
                break
        return fastest

    def gemm_tflops(dtype: Any) -> float:
        n = settings.gemm_n
        a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
        c = torch.empty(n, n, dtype=dtype, device=device)
        return round(2.0 * n**3 / best(lambda: torch.matmul(a, b, out=c)) / 1e12, 3)

    peaks: dict[str, float] = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        peaks["fp32_tflops"] = gemm_tflops(torch.float32)
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            peaks["tf32_tflops"] = gemm_tflops(torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    peaks["bf16_tflops"] = gemm_tflops(torch.bfloat16)
    peaks["fp16_tflops"] = gemm_tflops(torch.float16)
    n = settings.triad_elements
    a = torch.empty(n, dtype=torch.float32, device=device)
    b, c = (torch.rand(n, dtype=torch.float32, device=device) for _ in range(2))
    peaks["memory_bandwidth_gbs"] = round(3 * 4 * n / best(lambda: torch.add(b, c, alpha=3.0, out=a),
                                                           budget_s=0.5) / 1e9, 1)
    tiny = torch.zeros(1, device=device)

    def queued() -> None:
        for _ in range(settings.launches):
            tiny.add_(1.0)

    def round_trip() -> None:
        for _ in range(settings.launches // 20):
            tiny.add_(1.0)
            sync()

    if cuda:  # the host link, pinned and pageable (the GPU model's transfer term; the target's gpus.peaks)
        from modak.image.runtimes.pytorch import host_copy_gbs

        peaks.update(host_copy_gbs())
    launch = {"queued_us": round(best(queued, runs=3, budget_s=0.0) / settings.launches * 1e6, 2),
              "synchronized_us": round(best(round_trip, runs=3, budget_s=0.0) / (settings.launches // 20) * 1e6, 2)}
    return {"device": device, "peaks": peaks, "launch_overhead": launch,
            "method": f"best of >= 5 runs: GEMM {settings.gemm_n}^3 (torch.matmul), triad over {n} fp32 elements "
                      f"(3 x 4 B each); best of 3: {settings.launches} queued one-element adds (queued_us) and "
                      f"{settings.launches // 20} add+synchronize (synchronized_us), per kernel"}


class Exports:
    """Each job's model exported to ONNX on first use by modak's own export (:mod:`modak.workload.zoo`, loaded by
    path: the wheel holds its imports, not itself) into the scratch cache: the launches' reference and graph."""

    def __init__(self, run: Run) -> None:
        os.environ["MODAK_CACHE"] = run.env["MODAK_CACHE"]
        spec = importlib.util.spec_from_file_location("modak_zoo_export", ROOT / "modak" / "workload" / "zoo.py")
        assert spec and spec.loader
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = self.module
        spec.loader.exec_module(self.module)
        self.run = run
        self.jobs = {job["id"]: job for job in run.manifest["jobs"]}
        self.paths: dict[str, Path] = {}

    def model(self, job_name: str) -> Path:
        job = self.jobs[job_name]
        key = f"{job['zoo']} {json.dumps(job['input_shapes'], sort_keys=True)}"
        if key not in self.paths:
            t0 = time.monotonic()
            self.paths[key] = self.module.export_onnx(job["zoo"], job["input_shapes"])
            self.run.log(f"exported {key} in {time.monotonic() - t0:.1f} s")
        return self.paths[key]


def launch_command(settings: Settings, min_seconds: float, budget: float, check: bool = True) -> list[str]:
    """What ``modak bench`` starts for one candidate (:func:`modak.bench.harness.launch_command`)."""
    return [sys.executable, "-m", "modak.image.launch", "--", sys.executable, "-m", "modak.runtime", "measure",
            "--min-seconds", str(min_seconds), "--budget", str(budget), *([] if check else ["--no-check"])]


def prepare_launch(run: Run, entry: dict[str, Any], model: Path) -> dict[str, str]:
    """The launch's environment: its deployment (device cpu in the dry run), model and work folder."""
    deployment = json.loads((run.session / "candidates" / f"{entry['id']}.json").read_text())["deployment"]
    deployment["device"] = run.settings.device
    plan_file = run.scratch / "plans" / f"{entry['id']}.json"
    plan_file.parent.mkdir(exist_ok=True)
    plan_file.write_text(json.dumps({"deployment": deployment}, sort_keys=True))
    work = run.scratch / "work" / entry["runtime"]
    work.mkdir(parents=True, exist_ok=True)
    return {**run.env, "MODAK_PLAN": str(plan_file), "MODAK_MODEL": str(model), "MODAK_WORKDIR": str(work)}


def start(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(process: subprocess.Popen, timeout_s: float, settings: Settings) -> dict[str, Any]:
    """The launch's report (its last stdout line), or an error naming how it ended; its process group ended."""
    import signal

    try:
        stdout, stderr = process.communicate(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        stdout, stderr = "", ""
        cut = timeout_s < settings.launch_limit
        limit = "what was left of the session's budget" if cut else "a launch's limit"
        result = {"status": "error", "error": f"timed out after {timeout_s:.0f} s ({limit})", "cut_by_budget": cut}
    else:
        result = None
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()
    if result is not None:
        return result
    try:
        report = json.loads(stdout.strip().splitlines()[-1])
        if isinstance(report, dict) and "status" in report:
            return report
    except (IndexError, json.JSONDecodeError):
        pass
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": "error", "error": f"runner exited with {process.returncode}: {tail}"[:2000]}


def measured_row(template: dict[str, Any], result: dict[str, Any], session: str, machine: str,
                 device: str, peaks: dict[str, float]) -> dict[str, Any]:
    """The store row of one launch: as :func:`modak.bench.harness.aggregate_row` makes it of one launch (the
    failing result's as :func:`~modak.bench.harness.measurement_row` does), with the machine's probed ceilings
    (:func:`row_peaks`) in place of the plan's catalog peaks."""
    from modak.runtime.measure import contention_reasons

    row = dict(template, machine=machine, device=device, measured_at=_now(), **row_peaks(peaks))
    busy = contention_reasons(result.get("contention") or {}) if result.get("status") == "ok" else []
    versions = json.dumps({**result.get("versions", {}), "host": platform.node()}, sort_keys=True,
                          separators=(",", ":"))
    row.update(threads=result.get("threads") or template["threads"], repeats=result.get("repeats", 0),
               versions=versions, error=result.get("error"), max_abs_error=result.get("max_abs_error"),
               compile_s=result.get("compile_s"), peak_rss_mb=result.get("peak_rss_mb"))
    if result.get("status") != "ok":
        row.update(status=result.get("status", "error"), step_median_s=None, step_p10_s=None, step_p90_s=None,
                   throughput_per_s=None)
        return row
    median = float(result["step_median_s"])
    row.update(status="contended" if busy else "ok", step_median_s=median, step_p10_s=result["step_p10_s"],
               step_p90_s=result["step_p90_s"], throughput_per_s=template["batch_size"] / median,
               max_abs_error=result.get("max_abs_error") or 0.0, compile_s=result.get("compile_s") or 0.0,
               peak_rss_mb=result.get("peak_rss_mb") or 0.0, error="; ".join(sorted(set(busy))) or None,
               protocol=2, launches=1, launch_medians=json.dumps([median], separators=(",", ":")), session=session,
               ci_low_s=median, ci_high_s=median, spread=0.0,
               contention=json.dumps([{**(result.get("contention") or {}), "busy": busy, "retried_after": None}],
                                     sort_keys=True, separators=(",", ":")))
    return row


def row_peaks(peaks: dict[str, float]) -> dict[str, float]:
    """The perf store's ceiling columns of probed ``peaks`` (``ceilings.json``'s); none where the probe failed."""
    if not {"fp32_tflops", "bf16_tflops", "memory_bandwidth_gbs"} <= set(peaks):
        return {}
    return {"peak_fp32_gflops": round(peaks["fp32_tflops"] * 1000.0, 1),
            "peak_bf16_gflops": round(peaks["bf16_tflops"] * 1000.0, 1),
            "bandwidth_gbs": float(peaks["memory_bandwidth_gbs"])}


MIN_LAUNCH_S = 5.0  # a launch is not started with less of the budget left


def measure_candidates(run: Run, exports: Exports) -> None:
    """Launch the candidates in their order until the budget (less the sharing's reserve) is spent."""
    settings = run.settings
    launches = (run.out / "launches.jsonl").open("a", encoding="utf-8")
    candidates = run.manifest["candidates"]
    for number, entry in enumerate(candidates, 1):
        model = exports.model(entry["job"]) if run.left() - run.reserve_s >= MIN_LAUNCH_S else None
        left = run.left() - run.reserve_s  # after the model's export, if it was the first of its model
        if model is None or left < MIN_LAUNCH_S:
            run.log(f"budget: {len(candidates) - number + 1} of {len(candidates)} candidates not launched "
                    f"(from pass {entry['pass']})")
            break
        env = prepare_launch(run, entry, model)
        t0 = time.monotonic()
        process = start(launch_command(settings, settings.min_seconds, settings.measure_budget), env, run.scratch)
        result = finish(process, min(left, settings.launch_limit), settings)
        wall = time.monotonic() - t0
        launches.write(json.dumps({"id": entry["id"], "name": entry["name"], "job": entry["job"],
                                   "wall_s": round(wall, 2), "result": result}, sort_keys=True) + "\n")
        launches.flush()
        if result.get("cut_by_budget"):  # the session's clock, not the candidate: no row, launched next time
            run.log(f"pass {entry['pass']} {entry['job']} {entry['name']}: {result['error']}: not a row")
            continue
        row = measured_row(entry["row"], result, run.id, run.machine, settings.device, run.peaks)
        run.rows.append(row)
        run.write()
        if row["status"] in ("ok", "contended") and entry["job"] not in run.alone and entry["stock"]:
            run.alone[entry["job"]] = {"entry": entry, "result": result}
        step = f"{row['step_median_s'] * 1e3:.3f} ms" if row["step_median_s"] else row["error"]
        run.log(f"pass {entry['pass']} {entry['job']} {entry['name']}: {row['status']}, {step} "
                f"(compile {row['compile_s'] or 0:.1f} s, launch {wall:.1f} s)")
    launches.close()


def share(run: Run, exports: Exports) -> None:
    """:data:`SHARING_PROCESSES` processes of each sharing job's stock candidate at once: time-sliced, then under
    MPS if its daemon starts; one sharing.csv row per mode, job and count (each process's mean step against the
    job's launch alone: the slowdown; the processes' throughput over one alone is count / slowdown)."""
    settings = run.settings
    modes = [("time-slicing", {})]
    mps: dict[str, str] = {}
    if settings.device == "gpu" and shutil.which("nvidia-cuda-mps-control"):
        mps = {"CUDA_MPS_PIPE_DIRECTORY": str(run.scratch / "mps-pipe"),
               "CUDA_MPS_LOG_DIRECTORY": str(run.scratch / "mps-log")}
        for folder in mps.values():
            Path(folder).mkdir(parents=True, exist_ok=True)
    else:
        run.log("MPS: no nvidia-cuda-mps-control here (or the dry run): time-slicing only")
    jobs = {job["id"]: job for job in run.manifest["jobs"]}
    for mode, extra in modes + ([("mps", mps)] if mps else []):
        if mode == "mps":
            try:
                started = subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**run.env, **mps},
                                         capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                started = subprocess.CompletedProcess([], 124, "", "no answer in 30 s")
            if started.returncode != 0:
                run.log(f"MPS: the daemon did not start ({started.returncode}: {started.stderr.strip()[:300]})")
                break
            run.log("MPS: daemon started")
        try:
            for job_name in run.manifest["sharing"]:
                alone = run.alone.get(job_name)
                if alone is None:
                    run.log(f"sharing {mode} {job_name}: its stock candidate was not measured alone; skipped")
                    continue
                for count in run.manifest.get("sharing_processes", [2]):
                    share_once(run, exports, mode, extra, jobs[job_name], alone, count)
        finally:
            if mode == "mps":
                try:
                    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env={**run.env, **mps}, text=True,
                                   capture_output=True, timeout=30)
                    run.log("MPS: daemon quit")
                except subprocess.TimeoutExpired:
                    run.log("MPS: the daemon did not answer 'quit' in 30 s")


def share_once(run: Run, exports: Exports, mode: str, extra: dict[str, str], job: dict[str, Any],
               alone: dict[str, Any], count: int) -> None:
    """``count`` processes of ``job``'s stock candidate started together; its sharing.csv row."""
    settings = run.settings
    need = settings.share_seconds * 3 + 10
    if run.left() < need:
        run.log(f"sharing {mode} {job['id']} x{count}: {run.left():.0f} s left of the budget, {need:.0f} needed")
        return
    env = {**prepare_launch(run, alone["entry"], exports.model(job["id"])), **extra}
    command = launch_command(settings, settings.share_seconds, settings.share_seconds, check=False)
    processes = [start(command, env, run.scratch) for _ in range(count)]
    results = [finish(p, min(run.left(), settings.launch_limit), settings) for p in processes]
    if not all(r.get("status") == "ok" for r in results):
        run.log(f"sharing {mode} {job['id']} x{count}: failed: {[r.get('error') for r in results]}")
        return
    alone_s = float(alone["result"]["step_mean_s"])
    shared_s = sum(float(r["step_mean_s"]) for r in results) / len(results)
    slowdown = shared_s / alone_s
    run.log(f"sharing {mode} {job['id']} x{count} ({alone['entry']['name']}): {alone_s * 1e3:.3f} ms alone, "
            f"{shared_s * 1e3:.3f} ms each of {count} shared: slowdown {slowdown:.2f}, {count} jobs' throughput "
            f"{count / slowdown:.2f}x one alone")
    run.sharing.append(_sharing_row(run, mode, job, alone, results, alone_s, shared_s))
    run.write()


def _sharing_row(run: Run, mode: str, job: dict[str, Any], alone: dict[str, Any], results: list[dict[str, Any]],
                 alone_s: float, shared_s: float) -> dict[str, Any]:
    target = run.manifest["target"]
    gpu = target["gpus"]["model"] if run.machine == target["name"] else ""  # the catalog's name, if it is that GPU
    entry = alone["entry"]
    count = len(results)
    shape = "x".join(str(d) for d in next(iter(job["input_shapes"].values())))
    return {"point": f"gpu-session-{job['id']}-{mode}-{count}", "source": "modak benchmarks/data/gpu_session.py",
            "where": f"log.txt of {run.id}",
            "quote": f"alone {alone_s:.6g} s per step (mean over the timed window); shared {shared_s:.6g} s "
                     f"(mean of {count} processes: "
                     f"{', '.join(format(float(r['step_mean_s']), '.6g') for r in results)})",
            "gpu": run.describe.get("gpu", run.settings.device), "modak_gpu": gpu, "mode": mode,
            "metric": "slowdown", "jobs": count, "profile": "", "alone_profile": "",
            "workload": f"{job['zoo']} {job['task']} at batch {job['batch']}, {entry['name']}",
            "zoo": job["zoo"], "input_shape": shape, "task": job["task"], "batch_alone": job["batch"],
            "batch_shared": job["batch"], "precision": entry["row"]["precision"],
            "modak_precision": entry["row"]["precision"], "unit": "s per inference", "alone": alone_s,
            "shared": shared_s, "published": round(shared_s / alone_s, 6), "calibrate_on": "", "role": "compare",
            "notes": f"{count} processes of the same deployment started together, each timed for "
                     f"{run.settings.share_seconds:g} s without the reference check"
                     + (" (dry run on the CPU: not a GPU figure)" if run.settings.device == "cpu" else "")}


def machine_name(run: Run) -> str:
    """The rows' machine: the target's name, ``-dry-run`` appended in the dry run; on a GPU other than the target's
    (an H200 lent instead of the H100), ``gpu-`` and that GPU's name, said in the log."""
    target = run.manifest["target"]
    if run.settings.device == "cpu":
        return f"{target['name']}-dry-run"
    found = str(run.describe.get("gpu", ""))
    if not found:
        run.log(f"the GPU's name is unknown (the ceilings' process failed): rows are named {target['name']}")
    if not found or target["gpus"]["model"].split("-")[0].lower() in found.lower():
        return target["name"]
    name = "gpu-" + "-".join("".join(c if c.isalnum() else " " for c in found.lower()).split())
    run.log(f"the GPU is {found!r}, not the target's {target['gpus']['model']}: rows are named {name} and keep the "
            "probed peaks of ceilings.json")
    return name


def run_session(session: Path, out: Path, budget_s: float, dry_run: bool, reserve_s: float,
                skip: set[str] | None = None) -> int:
    """Measure ``session`` into ``out`` (the candidates in ``skip`` left out: an earlier run launched them)."""
    manifest = json.loads((session / "session.json").read_text())
    if manifest["dry_run"] != dry_run:
        print(f"gpu_session: {session} was planned {'with' if manifest['dry_run'] else 'without'} --dry-run; "
              f"run it {'with' if manifest['dry_run'] else 'without'} --dry-run too", file=sys.stderr)
        return 2
    settings = DRY_RUN if dry_run else GPU
    run = Run(session, out, budget_s, settings, reserve_s)
    if skip:
        run.manifest["candidates"] = [c for c in run.manifest["candidates"] if c["id"] not in skip]
        run.log(f"{len(skip)} candidates launched by an earlier run are left out")
    run.log(f"gpu_session run: {len(manifest['candidates'])} candidates of {len(manifest['jobs'])} jobs, budget "
            f"{budget_s:.0f} s ({reserve_s:.0f} s kept for sharing), device {settings.device}")
    try:
        run.install()
        t0 = time.monotonic()
        found = probe_device(run)
        run.describe = found["machine"]
        run.log(f"machine: {json.dumps(run.describe, sort_keys=True)}")
        if settings.device == "gpu" and run.describe.get("cuda") is False:
            run.log("no CUDA device: stopping (use --dry-run on a CPU machine)")
            return 3
        (out / "ceilings.json").write_text(json.dumps(found, indent=1, sort_keys=True))
        if "peaks" in found:
            run.peaks = found["peaks"]
            run.log(f"ceilings in {time.monotonic() - t0:.1f} s: {json.dumps(found['peaks'])}; launch overhead "
                    f"{json.dumps(found['launch_overhead'])}")
        else:
            run.log(f"ceilings failed after {time.monotonic() - t0:.1f} s (the candidates follow): {found['error']}")
        exports = Exports(run)
        run.machine = machine_name(run)
        measure_candidates(run, exports)
        share(run, exports)
        ok = sum(r["status"] == "ok" for r in run.rows)
        run.log(f"done: {len(run.rows)} rows ({ok} ok), {len(run.sharing)} sharing rows, "
                f"{time.monotonic() - run.start:.0f} s of {budget_s:.0f}")
        return 0
    finally:
        run.write()
        run.log_file.close()
        shutil.rmtree(run.scratch, ignore_errors=True)


def _write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """``rows`` as CSV of ``columns`` (empty for None), as :func:`modak.measurements.store.write_csv` writes."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row[c] for c in columns])
    os.replace(tmp, path)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def device_call(session: Path) -> str:
    """The device tool's call that runs ``session`` on the GPU machine (``session`` inside the checkout)."""
    try:
        where = session.relative_to(ROOT)
    except ValueError:
        return f"{session} is outside the checkout {ROOT}: the device tool carries only paths inside it"
    flag = "" if session == SESSION else f" --session {where}"
    return (f"the device tool's run: carry [\"{where}\"], timeout_s {DEVICE_TIMEOUT_S}, command:\n"
            f"PYTHONUNBUFFERED=1 python3 benchmarks/data/gpu_session.py run{flag} --out $OUT --budget "
            f"{DEVICE_BUDGET_S}")


# ------------------------------------------------------------------------------------------- import (host, after)

RUNS = ROOT / "perfmodels" / "gpu-runs"  # each run's log, ceilings, launches and sharing rows, by session
GPU_MEMORY_GB = 80  # the lent H100's (nvidia-smi: 81559 MiB), as the catalog's H100-SXM
BUDGET_CUT = "what was left of the session's budget"  # a launch the session's clock stopped: not a row


def cut_by_budget(launch: dict[str, Any]) -> bool:
    """Whether a launches.jsonl entry was stopped by the session's clock (not the candidate's failure)."""
    return bool(launch["result"].get("cut_by_budget")) or BUDGET_CUT in (launch["result"].get("error") or "")


def import_runs(outs: list[Path], session: Path, perfmodels: Path) -> dict[str, Any]:
    """Rows of one or more ``run`` outputs (a later one's row replaces an earlier one's of the same configuration)
    as ``perfmodels/<machine>.csv`` with the probed ceilings (each peak the best any run's probe measured) in its
    rows and in ``perfmodels/targets/<machine>.yaml``; each run's other files under ``perfmodels/gpu-runs/``; the
    zero-shot plans' predictions of the measured candidates (``session.json``) beside them. Returns the summary."""
    import yaml

    manifest = json.loads((session / "session.json").read_text())
    peaks: dict[str, float] = {}
    rows: dict[tuple, dict[str, Any]] = {}
    predicted = {(e["job"], e["name"]): e for e in manifest["candidates"]}
    runs = []
    for out in outs:
        found = json.loads((out / "ceilings.json").read_text())
        for key, value in found.get("peaks", {}).items():
            peaks[key] = max(peaks.get(key, 0.0), float(value))
        with (out / "rows.csv").open(newline="") as handle:
            measured = [row for row in csv.DictReader(handle) if BUDGET_CUT not in (row["error"] or "")]
        for row in measured:
            rows[tuple(row[c] for c in ("machine", "model", "task", "batch_size", "input_shapes", "runtime",
                                        "device", "precision", "params", "threads"))] = row
        launches = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines() if line]
        run_id = next((row["session"] for row in measured if row["session"]), out.name)
        folder = RUNS / run_id if perfmodels == ROOT / "perfmodels" else perfmodels / "gpu-runs" / run_id
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("log.txt", "ceilings.json", "launches.jsonl", "sharing.csv", "nvidia-smi.txt"):
            if (out / name).is_file():
                shutil.copyfile(out / name, folder / name)
        zero_shot = [{"job": launch["job"], "name": launch["name"],
                      "predicted_step_s": predicted.get((launch["job"], launch["name"]), {}).get("predicted_step_s"),
                      "plan_rank": predicted.get((launch["job"], launch["name"]), {}).get("plan_rank"),
                      "measured_step_s": launch["result"].get("step_median_s"), "status": launch["result"]["status"]}
                     for launch in launches if not cut_by_budget(launch)]
        (folder / "zero_shot.json").write_text(json.dumps(zero_shot, indent=1, sort_keys=True) + "\n")
        runs.append({"folder": str(folder.relative_to(perfmodels.parent)), "launches": len(launches),
                     "zero_shot": zero_shot})
    machines = {row["machine"] for row in rows.values()}
    if len(machines) != 1:
        raise SystemExit(f"gpu_session import: rows of {sorted(machines) or 'no machine'}; one machine per import")
    machine = machines.pop()
    for row in rows.values():
        row.update({k: str(v) for k, v in row_peaks(peaks).items()})
    columns = manifest["columns"]
    _write_csv(perfmodels / f"{machine}.csv", columns, list(rows.values()))
    target = {key: manifest["target"][key] for key in TARGET}  # TARGET's order
    target["name"] = machine
    target["gpus"] = {**target["gpus"], "memory_gb": GPU_MEMORY_GB, "peaks": peaks}
    devices = sorted({json.loads((out / "ceilings.json").read_text())["machine"].get("gpu", "?") for out in outs})
    header = (f"# Probed by benchmarks/data/gpu_session.py on a lent GPU machine ({', '.join(devices)}), each peak\n"
              f"# the best of {len(outs)} probe(s): {json.loads((outs[0] / 'ceilings.json').read_text())['method']}.\n"
              "# The rows of perfmodels/" + f"{machine}.csv carry these peaks. The CPU is not probed (a GPU step does "
              "not\n# depend on it); its microarchitecture is the plan's assumption.\n")
    (perfmodels / "targets").mkdir(parents=True, exist_ok=True)
    (perfmodels / "targets" / f"{machine}.yaml").write_text(header + yaml.safe_dump(target, sort_keys=False))
    return {"machine": machine, "rows": len(rows), "peaks": peaks, "runs": runs}


def zero_shot_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job: the zero-shot plan's pick among the measured candidates (the lowest predicted step of those that
    measured ok) against the measured best, and the zero-shot predictions' error on them."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for entry in run["zero_shot"]:
            if entry["status"] == "ok" and entry["predicted_step_s"]:
                by_job.setdefault(entry["job"], []).append(entry)
    table = []
    for job, entries in by_job.items():
        pick = min(entries, key=lambda e: e["predicted_step_s"])
        best = min(entries, key=lambda e: e["measured_step_s"])
        errors = [abs(e["predicted_step_s"] / e["measured_step_s"] - 1) for e in entries]
        table.append({"job": job, "measured": len(entries), "pick": pick["name"],
                      "pick_s": pick["measured_step_s"], "best": best["name"], "best_s": best["measured_step_s"],
                      "pick_over_best": pick["measured_step_s"] / best["measured_step_s"],
                      "mape": sum(errors) / len(errors)})
    return table


def report(outs: list[Path], session: Path) -> dict[str, Any]:
    """What #68 item 4 holds the runs against, from their outputs (nothing written): per job the zero-shot pick
    against the measured best (:func:`zero_shot_table`), the best samples/s against the first session's
    (:data:`FIRST_SESSION_BEST`) and MLPerf's ResNet-50 (:data:`MLPERF_RESNET50_OFFLINE`), the sharing rows'
    throughput (count / slowdown) time-sliced and under MPS and their ratio, and the GPU model's launch term fit
    leave-one-model-out on the runs' rows (MAPE of its steps)."""
    from modak.candidates.catalog import load_catalog
    from modak.measurements.store import read_csv
    from modak.predict.gpu import fit_launch, gpu_row, prior_node_us

    manifest = json.loads((session / "session.json").read_text())
    predicted = {(e["job"], e["name"]): e for e in manifest["candidates"]}
    zero_shot, rows, sharing = [], [], []
    for out in outs:
        for line in (out / "launches.jsonl").read_text().splitlines():
            launch = json.loads(line)
            if line and not cut_by_budget(launch):
                entry = predicted.get((launch["job"], launch["name"]), {})
                zero_shot.append({"job": launch["job"], "name": launch["name"], "status": launch["result"]["status"],
                                  "predicted_step_s": entry.get("predicted_step_s"), "regime": entry.get("regime"),
                                  "measured_step_s": launch["result"].get("step_median_s")})
        rows += [r for r in read_csv(out / "rows.csv") if r.status == "ok"]
        if (out / "sharing.csv").is_file():
            with (out / "sharing.csv").open(newline="") as handle:
                sharing += list(csv.DictReader(handle))
    batches = {job["id"]: job["batch"] for job in manifest["jobs"]}
    best: dict[str, float] = {}
    for entry in zero_shot:
        if entry["status"] == "ok" and entry["measured_step_s"]:
            rate = batches[entry["job"]] / entry["measured_step_s"]
            best[entry["job"]] = max(best.get(entry["job"], 0.0), rate)
    throughput = [{"job": job, "samples_per_s": rate, "first_session": FIRST_SESSION_BEST.get(job),
                   "mlperf": MLPERF_RESNET50_OFFLINE if job.startswith("resnet50-inference") else None}
                  for job, rate in sorted(best.items())]
    shared: dict[tuple[str, int], dict[str, float]] = {}
    for row in sharing:
        jobs = int(row["jobs"])
        shared.setdefault((row["workload"], jobs), {})[row["mode"]] = jobs / float(row["published"])
    sharing_table = [{"workload": w, "processes": n, **modes,
                      "mps_over_time_slicing": modes["mps"] / modes["time-slicing"]
                      if {"mps", "time-slicing"} <= set(modes) else None} for (w, n), modes in sorted(shared.items())]
    catalog = load_catalog()
    gpu_rows = [g for g in (gpu_row(r, catalog) for r in rows) if g is not None]
    errors = []
    for model in sorted({g.model for g in gpu_rows}):
        fits = fit_launch([g for g in gpu_rows if g.model != model])
        for g in (g for g in gpu_rows if g.model == model):
            fitted = fits.get(g.key)
            us = fitted.node_us if fitted else prior_node_us(catalog[g.key.runtime].performance["gpu"], g.key)
            errors.append(abs((g.transfer_s + max((g.nodes * us + g.call_us) * 1e-6, g.device_s)) / g.step_s - 1))
    return {"zero_shot": zero_shot_table([{"zero_shot": zero_shot}]), "throughput": throughput,
            "sharing": sharing_table, "launch_fit_lomo_mape": sum(errors) / len(errors) if errors else None,
            "launch_fit_rows": len(gpu_rows), "machine": rows[0].machine if rows else None}


def print_report(found: dict[str, Any]) -> None:
    print(f"{'job':<26} {'n':>2}  {'zero-shot pick':<72} {'pick ms':>8} {'best ms':>8} {'pick/best':>9} {'MAPE':>6}")
    for line in found["zero_shot"]:
        print(f"{line['job']:<26} {line['measured']:>2}  {line['pick']:<72} {line['pick_s'] * 1e3:>8.3f} "
              f"{line['best_s'] * 1e3:>8.3f} {line['pick_over_best']:>9.2f} {line['mape']:>6.0%}")
    print(f"\n{'job':<26} {'best samples/s':>14} {'first session':>13} {'x':>5} {'MLPerf':>8} {'x':>6}")
    for line in found["throughput"]:
        first, mlperf = line["first_session"], line["mlperf"]
        print(f"{line['job']:<26} {line['samples_per_s']:>14.1f} {first or 0:>13.1f} "
              f"{line['samples_per_s'] / first if first else 0:>5.2f} {mlperf or 0:>8.0f} "
              f"{line['samples_per_s'] / mlperf if mlperf else 0:>6.3f}")
    print(f"\n{'sharing workload':<60} {'n':>2} {'time-sliced':>11} {'MPS':>6} {'MPS/ts':>6}  (throughput / one alone)")
    for line in found["sharing"]:
        ratio = line["mps_over_time_slicing"]
        print(f"{line['workload'][:60]:<60} {line['processes']:>2} {line.get('time-slicing', 0):>11.2f} "
              f"{line.get('mps', 0):>6.2f} {ratio if ratio else 0:>6.2f}")
    mape = found["launch_fit_lomo_mape"]
    print(f"\nGPU model, launch term fit leave-one-model-out on {found['launch_fit_rows']} rows: MAPE "
          + (f"{mape:.1%}" if mape is not None else "-"))
    if found["machine"]:
        print(f"next: python3 -m modak model eval --machine {found['machine']} --seeds 1; "
              "python3 -m benchmarks.tools.ship_fits (after the import)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    phases = parser.add_subparsers(dest="phase", required=True)
    plan = phases.add_parser("plan", help="build the wheel, plan the jobs, write the session folder (CPU machine)")
    plan.add_argument("--session", type=Path, default=SESSION, help="the session folder (default .gpu-session)")
    plan.add_argument("--dry-run", action="store_true", help="tiny inputs and batches, for run --dry-run")
    plan.add_argument("--models", nargs="+", metavar="ZOO", help="only the jobs of these zoo models")
    run = phases.add_parser("run", help="measure the session's candidates (GPU machine)")
    run.add_argument("--session", type=Path, default=SESSION, help="the session folder plan wrote")
    run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-session-out"),
                     help="the output folder (default $OUT, else ./gpu-session-out)")
    run.add_argument("--budget", type=float, help=f"seconds for the whole run (default {DEVICE_BUDGET_S}; dry run 60)")
    run.add_argument("--sharing-seconds", type=float,
                     help=f"seconds of the budget kept for sharing (default {SHARING_RESERVE_S:g}; dry run 15)")
    run.add_argument("--dry-run", action="store_true", help="the same steps on the CPU, small and short")
    run.add_argument("--skip", type=Path, metavar="LAUNCHES",
                     help="an earlier run's launches.jsonl: its launched candidates are not launched again")
    imports = phases.add_parser("import", help="the runs' rows into perfmodels/ (CPU machine, after the runs)")
    imports.add_argument("outs", type=Path, nargs="+", metavar="OUT", help="run output folders, oldest first")
    imports.add_argument("--session", type=Path, default=SESSION, help="the session folder the runs measured")
    imports.add_argument("--perfmodels", type=Path, default=ROOT / "perfmodels", help=argparse.SUPPRESS)
    reports = phases.add_parser("report", help="the runs against the zero-shot plan, the first session, MLPerf")
    reports.add_argument("outs", type=Path, nargs="+", metavar="OUT", help="run output folders")
    reports.add_argument("--session", type=Path, default=SESSION, help="the session folder the runs measured")
    probe = phases.add_parser("ceilings", help="(run's own step) the machine and its ceilings as JSON")
    probe.add_argument("--dry-run", action="store_true", help="the CPU, small sizes")
    args = parser.parse_args(argv)
    if args.phase == "ceilings":
        settings = DRY_RUN if args.dry_run else GPU
        machine = describe_machine()
        try:
            found = ceilings(settings) if settings.device == "cpu" or machine["cuda"] else {}
        except Exception as exc:  # reported: the candidates are measured all the same
            found = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(json.dumps({**found, "machine": machine}, sort_keys=True))
        return 0
    if args.phase == "report":
        print_report(report(args.outs, args.session.resolve()))
        return 0
    if args.phase == "import":
        summary = import_runs(args.outs, args.session.resolve(), args.perfmodels.resolve())
        print(f"{summary['machine']}: {summary['rows']} rows, peaks {json.dumps(summary['peaks'])}")
        print(f"{'job':<26} {'n':>2}  {'zero-shot pick':<52} {'pick ms':>8} {'best ms':>8} {'pick/best':>9} "
              f"{'MAPE':>6}")
        for line in zero_shot_table(summary["runs"]):
            print(f"{line['job']:<26} {line['measured']:>2}  {line['pick']:<52} {line['pick_s'] * 1e3:>8.3f} "
                  f"{line['best_s'] * 1e3:>8.3f} {line['pick_over_best']:>9.2f} {line['mape']:>6.0%}")
        return 0
    if args.phase == "plan":
        session = args.session.resolve()
        manifest = plan_session(session, args.dry_run, args.models)
        print(f"{args.session}: {len(manifest['candidates'])} candidates of {len(manifest['jobs'])} jobs, wheel "
              f"{manifest['wheel']}")
        if not args.dry_run:
            print(device_call(session))
        return 0
    if not (args.session / "session.json").is_file():
        print(f"gpu_session: no {args.session}/session.json: run the plan phase first", file=sys.stderr)
        return 2
    budget = args.budget if args.budget is not None else (60.0 if args.dry_run else float(DEVICE_BUDGET_S))
    reserve = args.sharing_seconds if args.sharing_seconds is not None else (
        15.0 if args.dry_run else SHARING_RESERVE_S)
    skip = set()
    if args.skip:
        skip = {launch["id"] for launch in map(json.loads, args.skip.read_text().splitlines())
                if not cut_by_budget(launch)}
    return run_session(args.session.resolve(), args.out.resolve(), budget, args.dry_run, reserve, skip)


if __name__ == "__main__":
    raise SystemExit(main())
