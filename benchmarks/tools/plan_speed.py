"""Wall time of `modak plan` (process start included) on a 100 MB ResNet-50 ONNX job.

Side by side, interleaved, in one run:
- `python -c pass` (the floor), and importing the libraries any spec parser of this design needs (msgspec, PyYAML);
- **first plan on a fresh machine**: modak's whole cache removed before each run (no fits, no analysis, no
  runtime reports, no file digests), as on a new CI runner: the shipped fits are unpacked, the graph analyzed and
  every runtime asked which kernels it would run. The target is a file, so no probe runs: this is the time beyond
  the probe;
- **a new model**: only the runtimes' cached reports of the graph's kernels and the remembered predictions removed
  (what ONNX Runtime and OpenVINO need to say which kernels they would run, and the predictions made of them: the
  first plan of a model the planner has not seen);
- **warm**: everything cached (the steady state: the caches are keyed by the training data, the model file and
  modak's code, so they stay valid until a `modak bench` adds rows, the model file changes or modak is updated),
  with `--json` and with the table;
- **warm, with a local perf store**: as a user's after `modak bench --kernels` (one shipped machine's measured
  rows, kernel rows and reconciliations, 18,000 rows in all, as local rows: `--store`); its rows' keys are cached
  under the store file's identity, so this should cost what the warm plan does.

``--phases N`` then times the warm plan's steps inside one process, N fresh processes, and prints each step's
median: the imports of the parsers and of the spec models, loading the job, the planner's imports, the predictor,
the plan and its JSON (what the process spends beyond `python -c pass`, step by step).

The job's model is a user ONNX file of the size users have: ResNet-50 exported once from the zoo and saved as one
file, weights inline (102 MB), beside the job; the target is the shipped machine's
(perfmodels/targets/ci-epyc-2c-b.yaml). modak's modules are byte-compiled first, as `pip install` leaves them
(with PYTHONDONTWRITEBYTECODE set, as on CI machines, every start would otherwise compile them from source again).
Targets (#65): warm <= 5x `python -c pass`; the first plan on a fresh machine <= 15 s.

    python -m benchmarks.tools.plan_speed [--runs 7] [--phases 10]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "perfmodels" / "targets" / "ci-epyc-2c-b.yaml"
ZOO_JOB = """\
apiVersion: modak/v1
kind: Job
name: resnet50-infer
task: inference
model: {zoo: resnet50, input_shape: [3, 224, 224], batch_size: 1}
precision: [fp32, bf16]
"""
ONNX_JOB = """\
apiVersion: modak/v1
kind: Job
name: resnet50-infer
task: inference
model: {onnx: resnet50.onnx, batch_size: 1}
precision: [fp32, bf16]
"""


# The warm plan's steps, as `modak plan JOB --json` takes them, timed in one process (one JSON line of ms).
PHASES = """\
import time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import os, sys, io, json, contextlib
import yaml
mark("import PyYAML")
import msgspec
mark("import msgspec")
import modak.spec.models
mark("the spec models (classes and their defaults)")
import modak.cli, modak.api as api, modak.spec.loader
mark("import the CLI, API and loader")
loaded = api.load(sys.argv[1], sys.argv[2])
mark("load and validate the job and target")
import modak.plan, modak.predict.default, modak.workload.source
mark("import the planner")
predictor = api.predictor("default")
mark("the predictor (recipes, the fits' data keys)")
plan = api.plan_loaded(loaded, predictor)
mark("the plan")
from modak.output import print_json
with contextlib.redirect_stdout(io.StringIO()):
    print_json(plan.to_dict())
mark("JSON output")
print(json.dumps({b[0]: 1000 * (b[1] - a[1]) for a, b in zip(marks, marks[1:])}))
"""


def local_store(path: Path) -> str:
    """A perf store holding one shipped machine's rows, as `modak bench --kernels` leaves one; what it holds."""
    from modak.measurements.kernels import read_kernel_csv, read_reconcile_csv
    from modak.measurements.store import PerfStore, read_csv

    perfmodels = ROOT / "perfmodels"
    with PerfStore(path) as store:
        rows = store.add(read_csv(perfmodels / "cpu-ci-zen4-2c.csv"))
        kernels = read_kernel_csv(perfmodels / "kernels-ci-zen4-2c.csv")
        reconciled = read_reconcile_csv(perfmodels / "reconcile-ci-zen4-2c.csv")
        store.add_kernels(kernels, reconciled)
    return f"{rows} measured rows, {len(kernels)} kernel rows, {len(reconciled)} reconciliations"


def wall(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--phases", type=int, default=0, metavar="N",
                        help="then the warm plan's steps timed inside N fresh processes (medians)")
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "modak", quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cache = folder / "cache"
        env = {**os.environ, "MODAK_CACHE": str(cache), "MODAK_STORE": str(folder / "no-store.sqlite")}
        (folder / "zoo.yaml").write_text(ZOO_JOB)
        modak = [sys.executable, "-m", "modak", "plan", "--target", str(TARGET)]
        export = wall(modak + [str(folder / "zoo.yaml"), "--json"], env)  # exports ResNet-50 with PyTorch once
        exported = next((cache / "zoo").glob("resnet50-*/resnet50.onnx"))
        onnx.save_model(onnx.load(exported), folder / "resnet50.onnx", save_as_external_data=False)  # one file
        (folder / "job.yaml").write_text(ONNX_JOB)
        job = str(folder / "job.yaml")
        store = folder / "local.sqlite"
        holds = local_store(store)
        variants: dict[str, tuple[list[str], str | None]] = {  # command, and which caches it clears first
            "python -c pass": ([sys.executable, "-c", "pass"], None),
            "python: import msgspec, yaml (the parsers)": ([sys.executable, "-c", "import msgspec, yaml"], None),
            "modak plan --json, fresh machine (no cache)": (modak + [job, "--json"], "fresh"),
            "modak plan --json, a new model (reports)": (modak + [job, "--json"], "reports"),
            "modak plan --json, warm caches": (modak + [job, "--json"], None),
            "modak plan (table), warm caches": (modak + [job], None),
            "modak plan --json, warm, a local store": (modak + [job, "--json", "--store", str(store)], None),
        }
        wall(modak + [job, "--json"], env)  # warm up the file system cache
        fit = wall(modak + [job, "--json", "--store", str(store)], env)  # the store's rows change the fits' data
        fresh_cache = folder / "fresh-cache"  # the fresh machine's, so that the warm variants' caches stay
        fresh_env = {**env, "MODAK_CACHE": str(fresh_cache)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, (command, clears) in variants.items():
                if clears == "fresh":
                    shutil.rmtree(fresh_cache, ignore_errors=True)
                    times[name].append(wall(command, fresh_env))
                    continue
                if clears == "reports":
                    for report in [*(cache / "kernels").glob("*.json"), *(cache / "predictions").glob("*.json")]:
                        report.unlink()
                times[name].append(wall(command, env))
                if clears:  # leave the caches warm for the next variants
                    wall(command, env)
                    wall(variants["modak plan --json, warm, a local store"][0], env)
        phases = [json.loads(subprocess.run([sys.executable, "-c", PHASES, job, str(TARGET)], check=True,
                                            capture_output=True, text=True, env=env).stdout)
                  for _ in range(args.phases)]
    floor = statistics.median(times["python -c pass"])
    print(f"zoo export of ResNet-50 (first plan of the zoo job, once): {export:.1f} s")
    print(f"the local store: {holds}; its first plan (the fits refit on its rows, once): {fit:.1f} s")
    print(f"{'what (median of ' + str(args.runs) + ', interleaved)':<46} {'seconds':>8} {'min':>7} {'max':>7} "
          f"{'x python':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<46} {median:8.3f} {min(values):7.3f} {max(values):7.3f} {median / floor:9.1f}")
    fresh = statistics.median(times["modak plan --json, fresh machine (no cache)"])
    reports = statistics.median(times["modak plan --json, a new model (reports)"])
    warm = statistics.median(times["modak plan --json, warm caches"])
    print(f"a new model's reports add {reports - warm:.2f} s to the warm plan")
    print(f"target warm <= 5x python -c pass: {'met' if warm <= 5 * floor else 'NOT met'} ({warm / floor:.1f}x, "
          f"{warm:.3f} s)")
    print(f"target first plan on a fresh machine <= 15 s: {'met' if fresh <= 15 else 'NOT met'} ({fresh:.1f} s)")
    stored = statistics.median(times["modak plan --json, warm, a local store"])
    print(f"warm with a local store: {stored / warm:.2f}x the warm plan ({stored / floor:.1f}x python -c pass)")
    if phases:
        print(f"the warm plan's steps in one process (ms, median of {len(phases)}):")
        for name in phases[0]:
            print(f"  {name:<54} {statistics.median(p[name] for p in phases):7.1f}")
        print(f"  {'in all':<54} {statistics.median(sum(p.values()) for p in phases):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
