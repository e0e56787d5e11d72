"""Issue #15, items 2-4: ``model.batch_size: auto`` chosen by predicted throughput within the latency and memory
limits; the thread pools' wait policy as a recipe parameter that the launcher applies and the runtime obeys, chosen
by the target's allocation; both known to the predictors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from jsonschema import Draft202012Validator
from onnx import TensorProto, helper, numpy_helper

from modak import api
from modak.batching import AUTO_BATCH_SIZES
from modak.candidates.catalog import load_catalog
from modak.candidates.enumerate import enumerate_candidates
from modak.errors import InputError
from modak.hardware.ceilings import target_ceilings
from modak.plan import MEMORY_SHARE, NoCandidate, Plan, step_memory_gb
from modak.predict.learned import Features, example_from
from modak.predict.roofline import RooflinePredictor
from modak.render.ir import build_description
from modak.render.render import render
from modak.workload.source import load_analysis

ROOT = Path(__file__).resolve().parents[1]
PLAN_SCHEMA = json.loads((ROOT / "modak" / "schemas" / "plan.schema.json").read_text())
WIDTH = 1024  # two 1024x1024 MatMuls: a step's compute grows with the batch, its weights (8 MB) do not


def write_mlp(path: Path) -> None:
    """x[N, 1024] -> MatMul -> Relu -> MatMul: enough work per sample that bigger batches take longer."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), f"W{i}") for i in (1, 2)]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save_model(model, path)


def specs(folder: Path, model: dict[str, Any] | None = None, allocation: str = "exclusive", memory_gb: float = 8,
          **job: Any) -> Path:
    """A job (ONNX Runtime on the MLP unless ``job`` says otherwise) and a 2-core target; the job file."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "mlp.onnx").exists():
        write_mlp(folder / "mlp.onnx")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Target", "name": "lab",
        "cpu": {"microarchitecture": "zen4", "cores_per_socket": 2,
                "peaks": {"fp32_gflops": 450, "memory_bandwidth_gbs": 40}},
        "memory": {"size_gb": memory_gb}, "scheduler": {"kind": "none", "allocation": allocation}}))
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Job", "name": "auto", "target": "target.yaml", "task": "inference",
        "model": model or {"onnx": "mlp.onnx", "batch_size": "auto"}, "constraints": {"runtimes": ["onnxruntime"]},
        **job}, sort_keys=False))
    return folder / "job.yaml"


def roofline_plan(job: Path) -> Plan:
    return api.plan_job(job, predictor_name="roofline")


def by_batch(plan: Plan) -> dict[int, dict[str, Any]]:
    return {option["batch_size"]: option for option in plan.to_dict()["batches"]}


def test_auto_batch_without_limits_takes_the_most_samples_per_second(tmp_path: Path) -> None:
    plan = roofline_plan(specs(tmp_path))
    options = by_batch(plan)
    assert list(options) == list(AUTO_BATCH_SIZES) and not any(o["excluded"] for o in options.values())
    best = max(options.values(), key=lambda o: o["samples_per_second"])
    assert plan.workload.batch_size == plan.loaded.job.model.batch_size == best["batch_size"]
    assert plan.deployment().batch_size == best["batch_size"] and plan.choice.candidate.name == best["candidate"]
    rates = [options[b]["samples_per_second"] for b in AUTO_BATCH_SIZES]
    assert rates[-1] > rates[0]  # fixed costs spread over more samples
    data = plan.to_dict()
    Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["workload"]["batch_size"] == best["batch_size"] == data["deployment"]["batch_size"]
    assert data["reasons"][1].startswith(f"batch_size auto chose {best['batch_size']}: the most predicted samples")
    assert "1: " in data["reasons"][1] and "256: " in data["reasons"][1]


def test_a_tight_latency_limit_forces_a_small_batch(tmp_path: Path) -> None:
    free = by_batch(roofline_plan(specs(tmp_path / "free")))
    steps = {b: o["objective_seconds"] for b, o in free.items()}
    assert steps[1] < steps[16] < steps[32] < steps[256]  # the weights' traffic, then the compute, grows
    limit_ms = steps[16] * 1e3 * 1.01
    plan = roofline_plan(specs(tmp_path / "tight", constraints={"runtimes": ["onnxruntime"],
                                                                  "max_latency_ms": limit_ms}))
    options = by_batch(plan)
    within = [b for b, step in steps.items() if step * 1e3 <= limit_ms]
    assert plan.workload.batch_size == max(within, key=lambda b: b / steps[b]) <= 16
    assert plan.choice.prediction.step_seconds * 1e3 <= limit_ms
    assert all(options[b]["excluded"] == "constraints.max_latency_ms" and options[b]["candidate"] is None
               for b in AUTO_BATCH_SIZES if b not in within)
    assert f"constraints.max_latency_ms ({limit_ms:g} ms)" in plan.reasons[1]
    assert "256: excluded (constraints.max_latency_ms)" in plan.reasons[1]
    Draft202012Validator(PLAN_SCHEMA).validate(plan.to_dict())
    # a given batch is held to the same limit: every candidate over it is left out, and then the job cannot run
    with pytest.raises(NoCandidate) as raised:
        roofline_plan(specs(tmp_path / "fixed", model={"onnx": "mlp.onnx", "batch_size": 256},
                            constraints={"runtimes": ["onnxruntime"], "max_latency_ms": limit_ms}))
    assert raised.value.limits == ("constraints.max_latency_ms",)


def test_memory_excludes_huge_batches(tmp_path: Path) -> None:
    memory_gb = 0.0105  # 9.45 MB usable: the 8.4 MB of weights and up to ~86 samples' activations (12 KB each)
    plan = roofline_plan(specs(tmp_path, memory_gb=memory_gb))
    options = by_batch(plan)
    for batch, option in options.items():
        assert (option["excluded"] == "memory") == (option["memory_gb"] > MEMORY_SHARE * memory_gb), batch
    assert options[128]["excluded"] == options[256]["excluded"] == "memory" and options[64]["excluded"] is None
    assert plan.workload.batch_size <= 64
    assert step_memory_gb(plan.workload) == pytest.approx(options[plan.workload.batch_size]["memory_gb"], rel=1e-5)
    with pytest.raises(InputError, match="no batch size is within the limits") as raised:
        roofline_plan(specs(tmp_path / "tiny", memory_gb=0.009))  # not even the weights fit
    assert raised.value.field == "model.batch_size" and "256: excluded (memory)" in raised.value.message


@pytest.mark.slow
def test_auto_batch_through_the_command_line_with_the_learned_model(tmp_path: Path) -> None:
    job = specs(tmp_path)
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(job), "--json", "--predictor", "learned"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    Draft202012Validator(PLAN_SCHEMA).validate(data)
    assert data["candidates"][0]["predictor"] == "learned" and len(data["batches"]) == len(AUTO_BATCH_SIZES)
    chosen = max((o for o in data["batches"] if not o["excluded"]), key=lambda o: o["samples_per_second"])
    assert data["workload"]["batch_size"] == chosen["batch_size"]


@pytest.mark.parametrize("change, message", [
    ({"task": "training", "model": {"zoo": "mlp", "batch_size": "auto"}, "constraints": {}}, "'auto' is for inference"),
    ({"objective": {"metric": "latency"}}, "needs objective.metric throughput (not latency)"),
])
def test_auto_batch_needs_inference_for_throughput(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    job = specs(tmp_path, **change)
    line = next(i for i, text in enumerate(job.read_text().splitlines(), 1) if "batch_size" in text)
    with pytest.raises(InputError) as raised:
        api.load(job)
    assert str(raised.value).startswith(f"{job}:{line}: model.batch_size: ") and message in str(raised.value)
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(job)], capture_output=True, text=True)
    assert done.returncode == 2 and f"{job}:{line}: model.batch_size: " in done.stderr and message in done.stderr


def test_analyze_says_auto_needs_a_number(tmp_path: Path) -> None:
    job = specs(tmp_path)
    with pytest.raises(InputError, match="the analysis needs a number") as raised:
        load_analysis(api.load(job))
    assert raised.value.field == "model.batch_size"
    done = subprocess.run([sys.executable, "-m", "modak", "analyze", str(job)], capture_output=True, text=True)
    assert done.returncode == 2 and "model.batch_size: the analysis needs a number" in done.stderr


def test_the_allocation_chooses_the_wait_policy_without_doubling_the_candidates(tmp_path: Path) -> None:
    spaces = {}
    for allocation in ("exclusive", "shared"):
        loaded = api.load(specs(tmp_path / allocation, model={"zoo": "mlp", "batch_size": 8}, allocation=allocation,
                                constraints={}))
        spaces[allocation] = enumerate_candidates(loaded, target_ceilings(loaded.target, loaded.target_doc),
                                                  load_catalog(), frozenset({"matmul"}))
    policies = {a: {(c.runtime, c.param("wait_policy")) for c in s.candidates} for a, s in spaces.items()}
    spinning = {"onnxruntime", "pytorch", "torch-compile"}
    knobless = {(runtime, None) for runtime in ("openvino", "tvm", "xla")}  # no spin knob there
    assert policies["exclusive"] == {(r, "spin") for r in spinning} | knobless
    assert policies["shared"] == {(r, "passive") for r in spinning} | knobless
    assert len(spaces["exclusive"].candidates) == len(spaces["shared"].candidates)
    reasons = {p.runtime: p.reason for p in spaces["shared"].pruned}
    assert reasons["onnxruntime/cpu"] == "wait_policy=spin: passive wins on shared cores (target scheduler.allocation)"


def _launched(plan: Plan, out: Path) -> dict[str, Any]:
    """What a process started by the rendered entrypoint sees: its environment and the ONNX Runtime session
    options the runtime builds for the plan's choice."""
    ir = build_description(plan, created="2026-01-01T00:00:00Z")
    render(ir, out)
    script = (
        "import json, os\n"
        "from modak.image.deployment import read_deployment\n"
        "from modak.image.runtimes.base import RunRequest\n"
        "from modak.image.runtimes.onnxruntime import session_options\n"
        "d = read_deployment(os.environ['MODAK_PLAN'])\n"
        "options = session_options(RunRequest(d.runtime, d.device, d.precision, dict(d.params), None, d.task, '', "
        "None, d.batch_size, {}, ''))\n"
        "print(json.dumps({'env': dict(os.environ), 'intra': options.get_session_config_entry("
        "'session.intra_op.allow_spinning'), 'inter': options.get_session_config_entry("
        "'session.inter_op.allow_spinning')}))\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(out), "SLURM_CPUS_PER_TASK": str(len(os.sched_getaffinity(0))),
           "PYTHONPATH": str(out / ir.runtime_wheel), "MODAK_PLAN": str(out / "plan.json")}
    done = subprocess.run([str(out / "entrypoint.sh"), sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("allocation, spinning, omp", [("shared", "0", "PASSIVE"), ("exclusive", "1", "ACTIVE")])
def test_the_wait_policy_reaches_the_runtime(tmp_path: Path, allocation: str, spinning: str, omp: str) -> None:
    plan = roofline_plan(specs(tmp_path, model={"onnx": "mlp.onnx", "batch_size": 8}, allocation=allocation))
    policy = "passive" if allocation == "shared" else "spin"
    assert plan.choice.candidate.param("wait_policy") == policy
    seen = _launched(plan, tmp_path / "out")
    assert seen["intra"] == seen["inter"] == spinning
    assert seen["env"]["MODAK_WAIT_POLICY"] == policy and seen["env"]["OMP_WAIT_POLICY"] == omp
    assert ("OMP_PROC_BIND" in seen["env"]) == (policy == "spin")  # threads on shared cores are not pinned


def test_the_predictors_know_the_wait_policy(tmp_path: Path) -> None:
    loaded = api.load(specs(tmp_path, model={"onnx": "mlp.onnx", "batch_size": 8}, allocation="shared"))
    _, workload = load_analysis(loaded)
    ceilings = target_ceilings(loaded.target, loaded.target_doc)
    recipe = load_catalog()["onnxruntime"]
    space = enumerate_candidates(loaded, ceilings, load_catalog(), frozenset({"matmul"}))
    passive = next(c for c in space.candidates if c.runtime == "onnxruntime")
    spin = replace(passive, params=tuple((k, "spin" if k == "wait_policy" else v) for k, v in passive.params))
    roofline = RooflinePredictor()
    quiet_passive, quiet_spin = (roofline.predict(workload, ceilings, c, recipe) for c in (passive, spin))
    # Measured equal on quiet cores (the overhead probe, perfmodels/overhead/): no overhead effect.
    assert quiet_passive.term("overhead_s") == quiet_spin.term("overhead_s")
    features = Features.from_catalog(load_catalog())
    wait = next(p for p in features.parameters if p.name == "wait_policy")
    assert (wait.kind, wait.values) == ("categorical", ("spin", "passive"))
    rows = {c.param("wait_policy"): features.row(example_from(workload, ceilings, c, recipe)) for c in (spin, passive)}
    differ = [i for i, (a, b) in enumerate(zip(rows["spin"], rows["passive"])) if a != b]
    assert len(differ) == 2  # only the policy's own columns: rows measured with either policy train them
