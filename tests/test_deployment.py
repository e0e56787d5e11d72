"""One deployment environment: `modak bench` runs a candidate with exactly the environment the rendered
entrypoint gives the image, for every candidate of every runtime (issue #11, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from modak.api import load as load_job
from modak.bench.harness import launch_command, launch_environment
from modak.candidates.catalog import load_catalog
from modak.image.deployment import Deployment, DeploymentError, allocation_cpus, resolve_threads
from modak.plan import Plan, make_plan
from modak.predict.roofline import RooflinePredictor
from modak.render.ir import build_description
from modak.render.render import render
from modak.workload.source import load_analysis

LOCATIONS = {"MODAK_PLAN", "MODAK_MODEL", "MODAK_WORKDIR", "PYTHONPATH", "PWD", "OLDPWD", "SHLVL", "_"}


def _plan(folder: Path, runtime: str) -> Plan:
    folder.mkdir(parents=True, exist_ok=True)
    task = "training" if "inference" not in load_catalog()[runtime].tasks else "inference"
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Target", "name": "lab",
        "cpu": {"microarchitecture": "zen4", "cores_per_socket": 2}, "memory": {"size_gb": 8},
        "scheduler": {"kind": "none"}, "container": {"engine": "podman"}}))
    (folder / "job.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Job", "name": f"env-{runtime}", "target": "target.yaml", "task": task,
        "model": {"zoo": "mlp", "batch_size": 4}, "precision": ["fp32", "bf16"],
        "constraints": {"runtimes": [runtime]}}))
    loaded = load_job(folder / "job.yaml")
    return make_plan(loaded, *load_analysis(loaded), RooflinePredictor())


def _env(command: list[str], env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run(command, env=env, capture_output=True, check=True)
    pairs = (entry.partition(b"=") for entry in done.stdout.split(b"\0") if entry)
    return {k.decode(): v.decode() for k, _, v in pairs if k.decode() not in LOCATIONS}


@pytest.mark.parametrize("runtime", sorted(load_catalog()))
def test_bench_environment_is_the_entrypoints(runtime: str, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "spec", runtime)
    # the entrypoint's `python3` is this interpreter, as the launcher's is (in the image both are the venv's), not a
    # wrapper on PATH that sets variables of its own (pyenv's shim)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    base = {"PATH": path, "HOME": str(tmp_path), "SLURM_CPUS_PER_TASK": "2"}
    for index, ranked in enumerate(plan.ranked):
        chosen = replace(plan, ranked=(ranked, *(r for r in plan.ranked if r is not ranked)))
        out = tmp_path / f"out{index}"
        ir = build_description(chosen, created="2026-01-01T00:00:00Z")
        render(ir, out)
        image = _env([str(out / "entrypoint.sh"), "env", "-0"],
                     {**base, "PYTHONPATH": str(out / ir.runtime_wheel), "MODAK_PLAN": str(out / "plan.json")})
        bench_env = {**base, **launch_environment(plan, ranked.candidate, tmp_path / "bench.json", tmp_path / "w")}
        measured = _env(launch_command("env", "-0"), bench_env)
        assert measured == image, ranked.candidate.name
        threads = resolve_threads(plan.deployment(ranked.candidate).threads_policy, 2)
        assert image["MODAK_THREADS"] == image["OMP_NUM_THREADS"] == image["TVM_NUM_THREADS"] == str(threads)
        for variable, value in plan.recipe(ranked.candidate).environment(ranked.candidate).items():
            assert variable == "MODAK_PRELOAD" and image["LD_PRELOAD"].endswith(value) or image[variable] == value


def test_allocation_cpus_and_policies(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("300000 100000\n")
    assert allocation_cpus({}, tmp_path) == (3, "cgroup v2 cpu.max")
    assert allocation_cpus({"NCPUS": "5"}, tmp_path) == (5, "NCPUS")
    assert allocation_cpus({"SLURM_CPUS_PER_TASK": "0"}, tmp_path) == (3, "cgroup v2 cpu.max")
    assert [resolve_threads(p, 8) for p in ("all", "half", 3, 64, "HALF")] == [8, 4, 3, 8, 4]
    with pytest.raises(DeploymentError):
        resolve_threads("most", 8)
    deployment = Deployment("onnxruntime", "cpu", "fp32", "inference", {"threads": "half"}, {}, 2, {"x": [4]})
    assert Deployment.from_dict(deployment.to_dict()) == deployment
