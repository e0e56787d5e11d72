"""Data-parallel scaling (``modak scale``): the alpha-beta arithmetic against hand-computed values, the fit from
measured points, the command line, the spec's checks and the rendered job scripts of several workers (golden
files: regenerate with ``MODAK_UPDATE_GOLDEN=1``)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

import modak
from modak.allreduce import Link, ScalingModel, default_overlap, network_link
from modak.cli import main
from modak.render.ir import build_description
from modak.render.render import render
from modak.scaling import advise, fit
from tests.support.onnx_graphs import write_onnx
from tests.test_render import CREATED, GOLDEN, GOLDEN_VERSION, Preferred, _normalized, make_plan_for

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "modak" / "schemas" / "scale.schema.json").read_text())
PCIE = Link("pcie", 10.0, 5.0, "test")  # 10 GB/s, 5 us a step
NET = Link("net", 2.5, 20.0, "test")  # 20 Gbit/s, 20 us a step


def model(**changes: Any) -> ScalingModel:
    """4 workers a node, 10 nodes, 100 MB of gradients in one bucket, no base latency."""
    base = ScalingModel(compute_s=0.15, backward_share=2 / 3, gradient_bytes=1e8, overlap=0.75, workers_per_node=4,
                        max_nodes=10, intra=PCIE, network=NET, bucket_bytes=1e9, base_latency_us=0.0)
    return replace(base, **changes)


# ---- alpha-beta arithmetic -------------------------------------------------------------------------------------


def test_ring_and_tree_within_one_node() -> None:
    times = model().allreduce_s(4)
    # ring: 2(N-1) = 6 steps of 5 us + 2(N-1)/N x S / beta = 1.5 x 1e8 / 1e10
    assert times["ring"] == pytest.approx(6 * 5e-6 + 0.015)
    # tree: 2((g-1) x 5 us) + 2 x S / beta
    assert times["tree"] == pytest.approx(30e-6 + 0.02)
    assert model().predict(4).algorithm == "ring"


def test_ring_and_tree_across_nodes() -> None:
    times = model().allreduce_s(16)  # 4 nodes x 4: the network (2.5 GB/s) is the slowest link
    ring_latency = 2 * (16 - 4) * 5e-6 + 2 * (4 - 1) * 20e-6
    assert times["ring"] == pytest.approx(ring_latency + 2 * 15 / 16 * 1e8 / 2.5e9)
    tree_latency = 2 * (3 * 5e-6 + math.log2(4) * 20e-6)
    assert times["tree"] == pytest.approx(tree_latency + 2 * 1e8 / 2.5e9)


def test_flat_ring_is_the_textbook_formula() -> None:
    """One worker a node: T = 2(N-1) alpha + 2(N-1)/N x S / beta (plus the base latency per call)."""
    flat = model(workers_per_node=1, intra=None, base_latency_us=8.4, algorithms=("ring",))
    for n in (2, 3, 8):
        assert flat.allreduce_s(n)["ring"] == pytest.approx(8.4e-6 + 2 * (n - 1) * 20e-6
                                                            + 2 * (n - 1) / n * 1e8 / 2.5e9)


def test_buckets_repeat_the_latency_not_the_bandwidth() -> None:
    one, four = model().allreduce_s(16)["ring"], model(bucket_bytes=25e6).allreduce_s(16)["ring"]
    latency = 2 * 12 * 5e-6 + 2 * 3 * 20e-6
    assert four - one == pytest.approx(3 * latency)
    assert model(bucket_bytes=25e6).calls == 4 and model(bucket_bytes=3e7).calls == 4


def test_overlap_hides_at_most_the_backward_pass() -> None:
    m = model()  # backward 0.1 s, overlap 0.75
    short = m.allreduce_s(4)["ring"]
    assert m.exposed_s(short) == pytest.approx(0.25 * short)  # shorter than the backward pass: its last quarter
    assert m.exposed_s(0.2) == pytest.approx(0.2 - 0.75 * 0.1)  # longer: what 3/4 of the backward pass cannot hide
    point = m.predict(16)
    assert point.step_s == pytest.approx(0.15 + m.exposed_s(point.comm_s))
    assert point.efficiency == pytest.approx(0.15 / point.step_s)
    assert point.comm_share == pytest.approx(point.exposed_s / point.step_s)


def test_one_worker_has_no_communication_and_efficiency_one() -> None:
    point = model().predict(1)
    assert (point.step_s, point.comm_s, point.efficiency, point.algorithm) == (0.15, 0.0, 1.0, None)


def test_efficiency_falls_with_more_workers() -> None:
    m = model()
    points = [m.predict(n) for n in m.worker_counts()]
    assert [p.workers for p in points] == [1, 2, 4, 8, 16, 32, 40]
    assert all(a.efficiency >= b.efficiency for a, b in zip(points, points[1:]))
    assert points[-1].efficiency < points[1].efficiency < 1


def test_worker_counts_and_layouts() -> None:
    assert model().worker_counts(30) == (1, 2, 4, 8, 16, 28)  # beyond one node: whole nodes
    assert model().worker_counts(3) == (1, 2, 3)
    assert model(workers_per_node=8, max_nodes=1).worker_counts() == (1, 2, 4, 8)
    assert model(workers_per_node=1, intra=None, max_nodes=3).worker_counts() == (1, 2, 3)
    with pytest.raises(ValueError, match="whole nodes"):
        model().layout(6)
    with pytest.raises(ValueError, match="not connected"):
        model(network=None).allreduce_s(8)


def test_default_overlap_leaves_the_last_bucket() -> None:
    assert default_overlap(1e8, 25 * 2**20) == pytest.approx(1 - 26214400 / 1e8)
    assert default_overlap(1e6, 25 * 2**20) == 0.0  # one bucket: all-reduced after the backward pass


# ---- fit ------------------------------------------------------------------------------------------------------


def test_two_points_fit_the_bandwidth_and_keep_the_rest() -> None:
    truth = model(network=replace(NET, bandwidth_gbs=1.0))
    measured = {1: 0.15, 8: truth.predict(8).step_s}
    result = fit(model(), measured)
    assert result.fitted == ("compute_seconds", "network_bandwidth")
    assert set(result.kept) == {"overlap", "network_latency", "intra_bandwidth", "intra_latency"}
    assert result.model.network.bandwidth_gbs == pytest.approx(1.0, rel=1e-3)
    assert result.model.overlap == 0.75 and result.model.network.latency_us == 20.0
    for _, seconds, predicted in result.residuals():
        assert predicted == pytest.approx(seconds, rel=1e-4)


def test_more_points_fit_bandwidth_overlap_and_latency() -> None:
    truth = model(overlap=0.4, network=replace(NET, bandwidth_gbs=1.5, latency_us=60.0))
    measured = {n: truth.predict(n).step_s for n in (1, 8, 16, 40)}
    result = fit(model(), measured)
    assert result.fitted == ("compute_seconds", "network_bandwidth", "overlap", "network_latency")
    assert result.model.network.bandwidth_gbs == pytest.approx(1.5, rel=0.02)
    assert result.model.overlap == pytest.approx(0.4, abs=0.02)
    assert result.model.predict(32).step_s == pytest.approx(truth.predict(32).step_s, rel=0.01)


def test_points_within_a_node_fit_the_intra_node_link() -> None:
    truth = model(intra=replace(PCIE, bandwidth_gbs=4.0))
    result = fit(model(), {1: 0.15, 4: truth.predict(4).step_s})
    assert result.fitted == ("compute_seconds", "intra_bandwidth") and "network_bandwidth" in result.kept
    assert result.model.intra.bandwidth_gbs == pytest.approx(4.0, rel=1e-3) and result.model.network == NET


def test_without_one_worker_the_compute_time_is_fitted_first() -> None:
    truth = model(compute_s=0.3)
    result = fit(model(), {8: truth.predict(8).step_s})
    assert result.fitted == ("compute_seconds",)
    assert result.model.compute_s == pytest.approx(0.3, rel=1e-3)


def test_hidden_communication_leaves_the_bandwidth_undetermined() -> None:
    fast = model(intra=replace(PCIE, bandwidth_gbs=300.0))  # NVLink-class: the network is the only bottleneck
    result = fit(fast, {1: 0.15, 8: 0.15})
    assert "do not determine it" in result.notes[-1]
    assert result.model.predict(8).step_s == pytest.approx(0.15, rel=2e-3)
    # With PCIe inside the nodes, that link bounds the step from below whatever the network: 0.15 s is not reached.
    assert fit(model(), {1: 0.15, 8: 0.15}).model.predict(8).step_s == pytest.approx(
        0.15 + model().exposed_s(2 * 7 / 8 * 1e8 / 1e10 + 2 * 6 * 5e-6 + 2 * 20e-6), rel=1e-3)


@pytest.mark.parametrize("points, message", [({6: 0.2}, "whole nodes"), ({1: -1.0}, "positive")])
def test_bad_measured_points_are_input_errors(points: dict[int, float], message: str) -> None:
    from modak.errors import InputError

    with pytest.raises(InputError, match=message):
        fit(model(), points)


def test_tcp_sockets_move_data_below_the_line_rate() -> None:
    """Ethernet (TCP sockets) moves a collective's data at 0.54 of the line rate by default, RDMA networks at the
    line rate; a target's measured efficiency replaces the default, and the link's source says which it used."""
    tcp = network_link("ethernet", 40)
    assert tcp.bandwidth_gbs == pytest.approx(40 * 0.54 / 8) and "x 0.54" in tcp.source
    assert network_link("infiniband", 200).bandwidth_gbs == pytest.approx(25.0)
    measured = network_link("ethernet", 100, efficiency=0.8, given="the target's")
    assert measured.bandwidth_gbs == pytest.approx(10.0) and "the target's efficiency" in measured.source
    assert network_link("ethernet").bandwidth_gbs == pytest.approx(25 * 0.54 / 8)  # the default line rate too


# ---- the command line and the spec -------------------------------------------------------------------------------


def write_job(folder: Path, task: str = "training", scaling: dict | None = None, command: bool = True,
              nodes: int = 4, gpus: int = 0) -> Path:
    job: dict[str, Any] = {"apiVersion": "modak/v1", "kind": "Job", "name": "tiny", "target": "target.yaml",
                           "task": task, "model": {"zoo": "mlp", "batch_size": 8}}
    if command:
        (folder / "train.py").write_text("print('training')\n")
        job["entrypoint"] = {"command": ["python3", "train.py"], "files": ["train.py"]}
    if scaling is not None:
        job["scaling"] = scaling
    target = {"apiVersion": "modak/v1", "kind": "Target", "name": "cluster", "nodes": nodes,
              "cpu": {"microarchitecture": "icelake", "cores_per_socket": 16}, "memory": {"size_gb": 64},
              "network": {"interconnect": "infiniband", "bandwidth_gbps": 100},
              "scheduler": {"kind": "slurm", "partition": "cpu"}}
    if gpus:
        job["device"] = "gpu"
        target["gpus"] = {"model": "A100", "count": gpus}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    (folder / "target.yaml").write_text(yaml.safe_dump(target))
    return folder / "job.yaml"


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_scale_json_matches_its_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path)
    code, out, err = run(capsys, "scale", job, "--predictor", "roofline", "--json", "--measured", "1=0.01", "2=0.011")
    assert code == 0, err
    data = json.loads(out)
    Draft202012Validator(SCHEMA).validate(data)
    assert [p["workers"] for p in data["points"]] == [1, 2, 4]  # CPU: one worker a node, 4 nodes
    assert data["fit"]["fitted"] == ["compute_seconds", "network_bandwidth"]
    assert data["model"]["network"]["source"].startswith("fitted to the measured steps")
    chosen = data["chosen"]["workers"]
    assert all(p["efficiency"] >= 0.8 for p in data["points"] if p["workers"] <= chosen)
    assert (data["points"][0]["efficiency"] == 1.0
            and data["points"][1]["step_seconds"] == pytest.approx(0.011, rel=1e-3))


def test_scale_table_and_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "scale", write_job(tmp_path), "--predictor", "roofline", "--max-workers", "2",
                         "--measured", "1=0.01", "2=0.0101")
    assert code == 0, err
    assert "chose 2 worker(s)" in out and "max_workers is 2" in out and "weak scaling" in out
    assert "between nodes: infiniband" in out and "fit: measured vs predicted" in out
    code, out, err = run(capsys, "scale", write_job(tmp_path), "--predictor", "roofline", "--measured", "1=0.01",
                         "2=0.02")
    assert code == 0 and "chose 1 worker(s)" in out and "2 workers would give 0.50 < 0.8" in out


def test_scale_of_an_inference_job_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "scale", write_job(tmp_path, task="inference"), "--predictor", "roofline")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and ": task: modak scale predicts data-parallel training" in err


@pytest.mark.parametrize("argv, message", [(["--measured", "2:0.5"], "WORKERS=SECONDS"),
                                           (["--measured", "0=0.5"], "WORKERS=SECONDS"),
                                           (["--max-workers", "0"], "positive number")])
def test_bad_options_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                message: str) -> None:
    code, _, err = run(capsys, "scale", write_job(tmp_path), "--predictor", "roofline", *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("case, message", [
    ("inference", "scaling: data-parallel scaling is for training jobs"),
    ("no-command", "scaling: scaling runs the job's own training script"),
    ("efficiency", "scaling.min_efficiency"),
    ("network-efficiency", "target.yaml:11: network.efficiency: expected a number <= 1.0, got 1.5"),
    ("measured", "scaling.measured: measured point 3=0.2: 3 workers are neither part of one node nor whole nodes"),
])
def test_spec_checks_of_scaling(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str) -> None:
    job = {"inference": lambda: write_job(tmp_path, task="inference", scaling={}),
           "no-command": lambda: write_job(tmp_path, scaling={}, command=False),
           "efficiency": lambda: write_job(tmp_path, scaling={"min_efficiency": 1.5}),
           "network-efficiency": lambda: write_network_efficiency(write_job(tmp_path, scaling={}), 1.5),
           # GPU nodes of 2: 3 workers are not a layout (a located error when render fits to them)
           "measured": lambda: write_job(tmp_path, scaling={"measured": {1: 0.1, 3: 0.2}}, gpus=2)}[case]()
    code, _, err = run(capsys, "scale" if case == "measured" else "plan", job, "--predictor", "roofline")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def write_network_efficiency(job: Path, efficiency: float) -> Path:
    target = yaml.safe_load((job.parent / "target.yaml").read_text())
    target["network"]["efficiency"] = efficiency
    (job.parent / "target.yaml").write_text(yaml.safe_dump(target))
    return job


def test_schema_command_describes_scaling(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema", "job")
    scaling = json.loads(out)["$defs"]["Scaling"]
    assert code == 0 and {"min_efficiency", "max_workers", "gradient_dtype", "measured"} <= set(scaling["properties"])
    assert all(p.get("description") for p in scaling["properties"].values())


# ---- rendered job scripts ---------------------------------------------------------------------------------------


def scaled_case(folder: Path, scheduler: str, engine: str, nodes: int = 4, **scaling: Any) -> Any:
    """GPU training with the user's script on nodes of 4 H100s (InfiniBand), data-parallel."""
    write_onnx(folder / "model.onnx")
    (folder / "train.py").write_text("print('training')\n")
    job = {"name": "mlp-ddp", "target": "target.yaml", "task": "training", "device": "gpu",
           "model": {"zoo": "mlp", "batch_size": 64}, "constraints": {"runtimes": ["pytorch"]},
           "entrypoint": {"command": ["python3", "train.py", "--epochs", "3"], "files": ["train.py"]},
           "scaling": {"min_efficiency": 0.8, **scaling}}
    target = {"name": "gpu-cluster", "nodes": nodes, "cpu": {"microarchitecture": "zen3", "cores_per_socket": 32},
              "memory": {"size_gb": 512}, "gpus": {"model": "H100", "count": 4},
              "network": {"interconnect": "infiniband", "bandwidth_gbps": 200},
              "scheduler": {"kind": scheduler, "partition": "gpu", "account": "ml", "time_limit": "04:00:00"},
              "container": {"engine": engine}}
    plan, _ = make_plan_for(folder, job, target, Preferred("pytorch", "gpu", "fp32"), zoo="mlp")
    return plan


SCALED = {"slurm-scaled": ("slurm", "podman"), "pbs-scaled": ("pbs", "apptainer"), "bash-scaled": ("none", "docker")}


@pytest.mark.parametrize("case", SCALED)
def test_golden_job_scripts_of_several_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    monkeypatch.setattr(modak, "__version__", GOLDEN_VERSION)
    monkeypatch.delenv("MODAK_TEMPLATES", raising=False)
    plan = scaled_case(tmp_path / "spec", *SCALED[case], max_workers=8)
    ir = build_description(plan, CREATED)
    render(ir, tmp_path / "out")
    actual = _normalized((tmp_path / "out" / "job.sh").read_text(), plan)
    golden = GOLDEN / case / "job.sh"
    if os.environ.get("MODAK_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
    assert actual == golden.read_text(), f"{case} differs from {golden}; regenerate with MODAK_UPDATE_GOLDEN=1"
    subprocess.run(["bash", "-n", str(tmp_path / "out" / "job.sh")], check=True)
    job = ir.job
    if case == "bash-scaled":  # no scheduler: one node
        assert (job.workers, job.nodes, job.workers_per_node) == (4, 1, 4)
        assert "torchrun --standalone --nnodes=1 --nproc-per-node=4 --no-python" in actual
    else:
        assert (job.workers, job.nodes, job.workers_per_node, job.gpus) == (8, 2, 4, 4)
        assert "--nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d" in actual
    assert "set -- python3 train.py --epochs 3" in actual


def test_each_nodes_container_gets_the_gpus_allocated_on_that_node(tmp_path: Path) -> None:
    """Several nodes: the GPUs are read where the engine starts (srun's step on each node), not in the batch script,
    which sees only its own node's allocation."""
    plan = scaled_case(tmp_path / "spec", "slurm", "podman", max_workers=8)
    render(build_description(plan, CREATED), tmp_path / "out")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    fakes = {"podman": "printf '%s\\0' \"$@\"; printf 'END\\0'",
             "scontrol": "echo node1",  # one node that runs the first of two tasks (srun's, faked below)
             "srun": "while [[ $1 == --* ]]; do shift; done; SLURM_STEP_GPUS=0,1 \"$@\"; SLURM_STEP_GPUS=2,3 \"$@\""}
    for name, body in fakes.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7",
           "SLURM_JOB_GPUS": "0,1"}
    run = subprocess.run(["bash", str(tmp_path / "out" / "job.sh")], env=env, capture_output=True, check=True)
    tasks = [argv.split("\0") for argv in run.stdout.decode().split("END\0")[:-1]]
    assert [[t[i + 1] for i, a in enumerate(t) if a == "--device"] for t in tasks] == [
        ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]]
    assert all(t[:2] == ["run", "--device"] and "torchrun" in t for t in tasks)


def test_the_plan_decides_the_workers_and_job_sh_runs_them(tmp_path: Path) -> None:
    """The worker count is the plan's (plan.json's data_parallel, modak scale's choice); the job script renders it
    and decides nothing; a job without scaling has none."""
    plan = scaled_case(tmp_path / "spec", "slurm", "podman", max_workers=8)
    chosen = plan.to_dict()["data_parallel"]
    assert (chosen["workers"], chosen["nodes"], chosen["workers_per_node"]) == (8, 2, 4)
    assert chosen["min_efficiency"] == 0.8 and chosen["efficiency"] >= 0.8
    scale = advise(plan, single_node=False).chosen
    assert (scale.workers, scale.efficiency) == (chosen["workers"], pytest.approx(chosen["efficiency"], rel=1e-5))
    job = build_description(plan, CREATED).job
    assert (job.workers, job.nodes, job.workers_per_node) == (8, 2, 4)
    assert job.scaling_summary == chosen["summary"]
    write_onnx(tmp_path / "plain" / "model.onnx")
    single = make_plan_for(tmp_path / "plain", {"name": "mlp", "target": "target.yaml", "task": "training",
                                                 "model": {"zoo": "mlp", "batch_size": 64}},
                           {"name": "cpu", "cpu": {"microarchitecture": "zen3", "cores_per_socket": 8},
                            "memory": {"size_gb": 32}}, Preferred("pytorch", "cpu", "fp32"), zoo="mlp")[0]
    assert single.data_parallel is None and "data_parallel" not in single.to_dict()


def test_one_worker_renders_the_single_process_script(tmp_path: Path) -> None:
    """When the prediction keeps no second worker above min_efficiency, the job script is the plain one."""
    plan = scaled_case(tmp_path / "spec", "slurm", "podman", min_efficiency=1.0)
    job = build_description(plan, CREATED).job
    assert (job.workers, job.nodes) == (1, 1) and job.default_command == ()
    render(build_description(plan, CREATED), tmp_path / "out")
    text = (tmp_path / "out" / "job.sh").read_text()
    assert "#SBATCH --ntasks=1" in text and "torchrun" not in text and "srun" not in text
    assert "# Scaling: 1 data-parallel worker(s)" in text


def test_scaling_changes_nothing_else_in_the_build(tmp_path: Path) -> None:
    scaled = build_description(scaled_case(tmp_path / "a", "slurm", "podman", max_workers=8), CREATED)
    single = build_description(scaled_case(tmp_path / "b", "slurm", "podman", min_efficiency=1.0), CREATED)
    assert scaled.job.workers == 8 and single.job.workers == 1
    assert (scaled.command, scaled.apt_packages, scaled.pip) == (single.command, single.apt_packages, single.pip)


# ---- the published points ----------------------------------------------------------------------------------------


def test_published_points_carry_their_sources_and_load() -> None:
    from benchmarks.published import scale_published

    folder = ROOT / "perfmodels" / "published"
    rows = list(csv.DictReader((folder / "data_parallel_scaling.csv").open()))
    readme = (folder / "README.md").read_text()
    assert len(rows) >= 15
    for row in rows:
        assert all(row[k] for k in ("source", "where", "compute_source", "efficiency_source", "parameters_source"))
        assert f"`{row['source']}`" in readme, row["source"]
        if row["throughput_n"]:  # the efficiency is computed from the published images/s
            expected = float(row["throughput_n"]) / (int(row["workers"]) * float(row["throughput_1"]))
            assert float(row["published_efficiency"]) == pytest.approx(expected, abs=1e-4)
    points = scale_published.load(folder / "data_parallel_scaling.csv")
    assert all(0 < p.predicted() <= 1 for p in points)


DDP_SCRIPT = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} sum {value.item():g}")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_rendered_torchrun_line_starts_a_process_group(tmp_path: Path) -> None:
    """The launch line of a 2-node CPU job script, run for real: two torchrun agents on this machine stand in for
    the two nodes (rendezvous on 127.0.0.1, a free port instead of 29500), each starting the command it is given;
    the processes form one gloo group of 2 and all-reduce across it."""
    import socket

    write_onnx(tmp_path / "spec" / "model.onnx")
    (tmp_path / "spec" / "train.py").write_text("print('training')\n")
    job = {"name": "mlp-ddp", "target": "target.yaml", "task": "training", "model": {"zoo": "mlp", "batch_size": 64},
           "constraints": {"runtimes": ["pytorch"]}, "entrypoint": {"command": ["python3", "train.py"],
                                                                    "files": ["train.py"]}, "scaling": {}}
    target = {"name": "cpu-pair", "nodes": 2, "cpu": {"microarchitecture": "icelake", "cores_per_socket": 8},
              "memory": {"size_gb": 32}, "network": {"interconnect": "ethernet"},
              "scheduler": {"kind": "slurm", "partition": "cpu"}, "container": {"engine": "podman"}}
    plan, _ = make_plan_for(tmp_path / "spec", job, target, Preferred("pytorch", "cpu", "fp32"), zoo="mlp")
    render(build_description(plan, CREATED), tmp_path / "out")
    text = (tmp_path / "out" / "job.sh").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text and "--gpus-per-node" not in text
    line = next(line for line in text.splitlines() if "torchrun --" in line and not line.startswith("#"))
    launch = line[line.index("torchrun"):]
    assert launch.startswith("torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d") and launch.endswith('"$@"')
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    script = (f'MODAK_MASTER=127.0.0.1; MODAK_RUN_ID=test; set -- {sys.executable} {tmp_path / "ddp.py"}; '
              + launch.replace(":29500", f":{port}"))
    agents = [subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    outputs = [agent.communicate(timeout=180)[0] for agent in agents]
    assert all(agent.returncode == 0 for agent in agents), outputs
    ranks = sorted(line for out in outputs for line in out.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 of 2 local 0 sum 3", "rank 1 of 2 local 0 sum 3"], outputs
