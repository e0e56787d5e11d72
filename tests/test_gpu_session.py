"""The prepared GPU session (``benchmarks/data/gpu_session.py``, #41), rehearsed on the CPU: ``plan --dry-run`` then
``run --dry-run`` end to end, on two of its models (YOLO-small inference and ResNet-18 training at tiny inputs)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from modak import api
from modak.bench.harness import aggregate_row
from modak.measurements.store import read_csv

pytestmark = pytest.mark.slow  # the dry run plans ten jobs and measures through the launcher (about a minute)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "data" / "gpu_session.py"
# What the GPU machine lacks (msgspec, archspec, hatchling) and what images must not need (test_layers.py's
# NOT_IN_IMAGE): the rehearsal's run phase cannot import them.
HOST_ONLY = {"msgspec", "archspec", "hatchling", "yaml", "sklearn", "scipy", "matplotlib", "jinja2", "docker",
             "spython", "rich"}
BLOCKER = f"""import sys


class _HostOnly:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(HOST_ONLY)!r}:
            raise ModuleNotFoundError("not on the GPU machine: " + name)


sys.meta_path.insert(0, _HostOnly())
"""


@pytest.fixture(scope="module")
def script() -> ModuleType:
    from benchmarks.data import gpu_session

    return gpu_session


def _call(*args: str, python_path: tuple[Path, ...] = (ROOT,)) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, python_path))}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The session folder and the run's output folder of one dry run; the run as on the GPU machine, where the
    checkout's modak and the host-only packages cannot be imported (a ``sitecustomize`` refuses them)."""
    session, out = tmp_path_factory.mktemp("session"), tmp_path_factory.mktemp("out")
    planned = _call("plan", "--dry-run", "--models", "yolo_small", "resnet18", "--session", str(session))
    assert planned.returncode == 0, planned.stderr
    blocker = tmp_path_factory.mktemp("gpu-machine")
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    ran = _call("run", "--dry-run", "--session", str(session), "--out", str(out), "--budget", "35",
                python_path=(blocker,))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return session, out


def test_plan_writes_the_wheel_the_jobs_and_every_candidates_deployment(rehearsal: tuple[Path, Path]) -> None:
    session, _ = rehearsal
    manifest = json.loads((session / "session.json").read_text())
    assert manifest["dry_run"] and (session / manifest["wheel"]).name.startswith("modak_runtime-")
    assert [j["id"] for j in manifest["jobs"]] == ["yolo_small-inference-b1", "yolo_small-inference-b2",
                                                   "resnet18-training-b2"]
    names = {c["name"] for c in manifest["candidates"] if c["job"] == "resnet18-training-b2"}
    # the plan's own: eager at four precisions x channels_last x io (its CUDA graphs are an inference lever: 16),
    # compile also x its two modes x cuda_graphs (64)
    assert len(names) == 16 + 64
    assert "torch-compile/gpu/fp16 mode=default channels_last=true cuda_graphs=true io=pinned" in names
    assert all(c["predicted_step_s"] and c["regime"] in {"launch", "transfer", "compute", "memory"}
               for c in manifest["candidates"])
    autotune = [c["pass"] for c in manifest["candidates"] if c["mode"] == "max-autotune-no-cudagraphs"]
    assert autotune and set(autotune) == {max(c["pass"] for c in manifest["candidates"])}  # the last pass
    assert manifest["sharing_processes"] == [2]  # the dry run's; the GPU run's are 2, 4 and 8
    for entry in manifest["candidates"]:
        deployment = json.loads((session / "candidates" / f"{entry['id']}.json").read_text())["deployment"]
        assert deployment["device"] == "gpu" and deployment["zoo"] == entry["row"]["model"]
    assert [c["pass"] for c in manifest["candidates"][:3]] == [1, 1, 1]
    assert all(c["stock"] for c in manifest["candidates"][:3])


def test_dry_run_writes_rows_ceilings_and_log(rehearsal: tuple[Path, Path]) -> None:
    _, out = rehearsal
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).is_file() for f in files)  # what the device tool brings back
    rows = list(read_csv(out / "rows.csv"))
    launches = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines()]
    assert rows and len(rows) == len(launches)
    assert all(r.status in {"ok", "incorrect", "error", "contended"} and r.machine == "gpu-h100-dry-run"
               and r.device == "cpu" for r in rows)
    measured = [r for r in rows if r.status in ("ok", "contended")]
    assert measured and all(r.step_median_s > 0 and r.launches == 1 and r.protocol == 2 for r in measured)
    ceilings = json.loads((out / "ceilings.json").read_text())
    assert set(ceilings["peaks"]) == {"fp32_tflops", "bf16_tflops", "fp16_tflops", "memory_bandwidth_gbs"}
    assert all(v > 0 for v in ceilings["peaks"].values()) and ceilings["launch_overhead"]["queued_us"] > 0
    log = (out / "log.txt").read_text()
    assert "launches import modak from" in log and "/site/modak/" in log  # the wheel, not the checkout
    assert "sharing time-slicing yolo_small-inference-b1 x2" in log and "done:" in log
    sharing = (out / "sharing.csv").read_text().splitlines()
    assert len(sharing) == 2 and ",time-slicing,slowdown,2," in sharing[1]


def test_rows_are_the_harness_rows(rehearsal: tuple[Path, Path]) -> None:
    """A dry-run row is what ``modak bench``'s :func:`aggregate_row` makes of the same launch."""
    session, out = rehearsal
    rows = list(read_csv(out / "rows.csv"))
    launches = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines()]
    index = next(i for i, r in enumerate(rows) if r.status in ("ok", "contended"))
    launch, row = launches[index], rows[index]
    plan = api.plan_job(session / "jobs" / f"{launch['job']}.yaml")
    candidate = next(r.candidate for r in plan.ranked if r.candidate.name == launch["name"])
    from modak.runtime.measure import contention_reasons

    result = {**launch["result"], "busy": contention_reasons(launch["result"]["contention"])}
    expected = aggregate_row(plan, candidate, [result], row.session)
    ignored = {"machine", "device", "measured_at", "versions", "peak_fp32_gflops", "peak_bf16_gflops", "bandwidth_gbs"}
    # approx: aggregate_row's center of one launch is exp(log(median)), a rounding away from the median
    assert {k: v for k, v in row.__dict__.items() if k not in ignored} == pytest.approx(
        {k: v for k, v in expected.__dict__.items() if k not in ignored}, rel=1e-12)
    peaks = json.loads((out / "ceilings.json").read_text())["peaks"]  # the probed ceilings, not the catalog's
    assert (row.peak_fp32_gflops, row.peak_bf16_gflops, row.bandwidth_gbs) == (
        round(peaks["fp32_tflops"] * 1000, 1), round(peaks["bf16_tflops"] * 1000, 1), peaks["memory_bandwidth_gbs"])
    assert row.peak_fp32_gflops != expected.peak_fp32_gflops


def test_import_writes_the_rows_the_probed_target_and_the_zero_shot_table(rehearsal: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    from modak.hardware.ceilings import target_ceilings
    from modak.spec.loader import load_spec
    from modak.spec.target import Target

    session, out = rehearsal
    done = _call("import", str(out), "--session", str(session), "--perfmodels", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = list(read_csv(tmp_path / "gpu-h100-dry-run.csv"))
    assert rows and all("session's budget" not in (r.error or "") for r in rows)
    target, doc = load_spec(tmp_path / "targets" / "gpu-h100-dry-run.yaml", Target)
    ceilings = target_ceilings(target, doc)
    assert ceilings.gpu is not None and ceilings.gpu.measured
    assert {r.peak_bf16_gflops for r in rows} == {ceilings.gpu.peak_gflops["bf16"]}
    run_folder = next((tmp_path / "gpu-runs").iterdir())
    zero_shot = json.loads((run_folder / "zero_shot.json").read_text())
    assert {z["job"] for z in zero_shot} == {r.model + "-" + r.task + f"-b{r.batch_size}" for r in rows}
    assert all(z["predicted_step_s"] for z in zero_shot)
    assert "pick/best" in done.stdout
    assert all(z["job"] in done.stdout for z in zero_shot if z["status"] == "ok" and z["predicted_step_s"])


def test_a_launch_the_sessions_clock_stops_is_not_the_candidates_error(script: ModuleType) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    cut = script.finish(script.start(sleeper, dict(os.environ), ROOT), 1.0, script.GPU)
    assert cut["status"] == "error" and cut["cut_by_budget"] and script.cut_by_budget({"result": cut})
    one_second = dataclasses.replace(script.DRY_RUN, launch_limit=1.0)  # the launch's own limit reached
    limited = script.finish(script.start(sleeper, dict(os.environ), ROOT), 1.0, one_second)
    assert limited["status"] == "error" and not script.cut_by_budget({"result": limited})


def test_passes_put_each_jobs_stock_and_best_of_each_kind_first(script: ModuleType) -> None:
    def entry(job: str, name: str, stock: bool = False) -> dict:
        runtime, _, precision = name.split(" ")[0].split("/")
        mode = next((w.split("=")[1] for w in name.split() if w.startswith("mode=")), None)
        return {"id": f"{job}:{name}", "job": job, "name": name, "runtime": runtime, "mode": mode, "stock": stock,
                "precision": precision, "cuda_graphs": "cuda_graphs=true" in name,
                "io": "pinned" if "io=pinned" in name else "pageable"}

    names = ["torch-compile/gpu/bf16 mode=max-autotune-no-cudagraphs", "torch-compile/gpu/bf16 mode=default",
             "torch-compile/gpu/bf16 mode=default cuda_graphs=true", "pytorch/gpu/bf16 io=pinned",
             "pytorch/gpu/bf16 cuda_graphs=true", "torch-compile/gpu/fp32 mode=default", "pytorch/gpu/tf32",
             "pytorch/gpu/fp16", "pytorch/gpu/fp32", "pytorch/gpu/bf16"]
    jobs = [[entry(job, name, stock=name == "pytorch/gpu/fp32") for name in names] for job in ("a", "b")]
    order = [(e["pass"], e["job"], e["name"]) for e in script.prioritized(jobs)]
    expected = [(1, "pytorch/gpu/fp32"), (2, "pytorch/gpu/bf16 io=pinned"),
                (3, "torch-compile/gpu/bf16 mode=default"), (4, "pytorch/gpu/bf16 cuda_graphs=true"),
                (5, "torch-compile/gpu/bf16 mode=default cuda_graphs=true"), (7, "pytorch/gpu/tf32"),
                (8, "pytorch/gpu/fp16"), (9, "torch-compile/gpu/fp32 mode=default"), (9, "pytorch/gpu/bf16"),
                (10, "torch-compile/gpu/bf16 mode=max-autotune-no-cudagraphs")]
    # pass 6 (pinned) finds nothing the best eager did not take; within a pass the jobs take turns
    assert order == [(number, job, name) for number, name in expected for job in ("a", "b")][:6] + [
        (number, job, name) for number, name in expected[3:7] for job in ("a", "b")] + [
        (9, "a", "torch-compile/gpu/fp32 mode=default"), (9, "b", "torch-compile/gpu/fp32 mode=default"),
        (9, "a", "pytorch/gpu/bf16"), (9, "b", "pytorch/gpu/bf16"),
        (10, "a", "torch-compile/gpu/bf16 mode=max-autotune-no-cudagraphs"),
        (10, "b", "torch-compile/gpu/bf16 mode=max-autotune-no-cudagraphs")]


def test_report_rehearsed_on_the_dry_run(rehearsal: tuple[Path, Path]) -> None:
    session, out = rehearsal
    done = _call("report", str(out), "--session", str(session))
    assert done.returncode == 0, done.stderr
    assert "pick/best" in done.stdout and "first session" in done.stdout and "MPS/ts" in done.stdout
    assert "launch term fit leave-one-model-out" in done.stdout
    assert "modak model eval --machine gpu-h100-dry-run" in done.stdout
    assert "yolo_small-inference-b1" in done.stdout


def test_run_refuses_a_session_planned_for_the_other_mode(rehearsal: tuple[Path, Path], tmp_path: Path) -> None:
    session, _ = rehearsal
    refused = _call("run", "--session", str(session), "--out", str(tmp_path))
    assert refused.returncode == 2 and "planned with --dry-run" in refused.stderr
    assert not list(tmp_path.iterdir())


def test_the_documented_device_call_is_the_one_plan_prints(script: ModuleType) -> None:
    call = script.device_call(script.SESSION)
    command = call.splitlines()[-1]
    assert command == "PYTHONUNBUFFERED=1 python3 benchmarks/data/gpu_session.py run --out $OUT --budget 480"
    assert f'carry [".gpu-session"], timeout_s {script.DEVICE_TIMEOUT_S}' in call
    readme = (ROOT / "perfmodels" / "README.md").read_text()
    for text in (script.__doc__, readme):
        assert command in text and f"timeout_s: {script.DEVICE_TIMEOUT_S}" in text and '[".gpu-session"]' in text
    assert "/.gpu-session/" in (ROOT / ".gitignore").read_text().split()  # carried, never committed
    assert "outside the checkout" in script.device_call(Path("/tmp/elsewhere"))
