"""`modak pack`: the sharing model's terms, pack decisions on synthetic predictions (limits respected, memory
refused, GPU sharing), the rendered core sets, MPS and MIG job scripts (golden files) and the command line.

Regenerate the golden files with ``MODAK_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

import modak
from modak import api
from modak.advise.contention import (
    Load,
    bandwidth_slowdowns,
    gpu_time_sliced_slowdowns,
    mps_percentages,
    mps_slowdowns,
    time_sliced_slowdowns,
)
from modak.advise.pack import MIN_GAIN, core_splits, mig_profiles, slices_fit
from modak.cli import main
from modak.errors import InputError
from modak.predict.base import Prediction
from modak.predict.roofline import thread_shares
from modak.render.sharing import Sharing, cpuset
from tests.support.onnx_graphs import write_onnx

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "pack"
SCHEMA = json.loads((ROOT / "modak" / "schemas" / "pack.schema.json").read_text())


def cpu(name: str, demand: float, bandwidth: float = 0.0, memory: float = 0.0, spins: bool = False) -> Load:
    return Load(name, 0.01, demand, 0.0, memory, bandwidth, spins)


def gpu(name: str, utilization: float) -> Load:
    return Load(name, 0.01, 0.0, utilization, 0.0, 0.0)


# The sharing model --------------------------------------------------------------------------------------------------


def test_time_slicing_slows_by_the_oversubscription() -> None:
    assert time_sliced_slowdowns([cpu("a", 1.0), cpu("b", 1.0)], 2) == [1.0, 1.0]  # fits: no slowdown
    two = time_sliced_slowdowns([cpu("a", 2.0), cpu("b", 2.0)], 2)
    assert two == pytest.approx([2.0 * 1.1, 2.0 * 1.1])  # D = 2, plus the cost of switching
    spin = time_sliced_slowdowns([cpu("a", 2.0, spins=True), cpu("b", 1.0)], 2)
    assert spin[0] > spin[1] > 1.5


def test_a_barrier_synchronised_pool_goes_at_its_slowest_threads_pace() -> None:
    busy = cpu("busy loop", 1.0)
    pool = Load("intra-op pool", 0.01, 2.0, 0.0, 0.0, 0.0, threads=2, synchronized=1.0)
    streams = Load("independent threads", 0.01, 2.0, 0.0, 0.0, 0.0, threads=2, synchronized=0.0)
    # One busy loop on one of two cores: the pool's thread beside it gets half a core, and the other thread waits
    # for it at every barrier (K = 2); threads that never wait for each other get the average share (D = 1.5).
    # Both pay the switching cost.
    assert time_sliced_slowdowns([pool, busy], 2)[0] == pytest.approx(2.0 * 1.05)
    assert time_sliced_slowdowns([streams, busy], 2)[0] == pytest.approx(1.5 * 1.05)
    half = Load("half synchronised", 0.01, 2.0, 0.0, 0.0, 0.0, threads=2, synchronized=0.5)
    assert time_sliced_slowdowns([half, busy], 2)[0] == pytest.approx((0.5 * 2.0 + 0.5 * 1.5) * 1.05)
    # A co-runner busy 40% of the time: the pool waits for the thread it shares a core with whenever it runs
    # (K = 1.4 against the average share's D = 1.2); on three cores the free one takes it.
    light = cpu("light", 0.4)
    assert time_sliced_slowdowns([pool, light], 2)[0] == pytest.approx(1.4 * 1.02)
    assert time_sliced_slowdowns([streams, light], 2)[0] == pytest.approx(1.2 * 1.02)
    assert time_sliced_slowdowns([pool, light], 3) == [1.0, 1.0]
    # One thread beside one busy loop on one core: both the straggler and the average share are 2.
    single = Load("one thread", 0.01, 1.0, 0.0, 0.0, 0.0, threads=1, synchronized=0.0)
    assert time_sliced_slowdowns([single, busy], 1)[0] == pytest.approx(2.0 * 1.1)


def test_memory_bandwidth_stretches_the_memory_bound_share() -> None:
    loads = [cpu("a", 1, bandwidth=30.0, memory=0.5), cpu("b", 1, bandwidth=30.0, memory=0.0)]
    assert bandwidth_slowdowns(loads, 60.0) == [1.0, 1.0]
    assert bandwidth_slowdowns(loads, 40.0) == pytest.approx([1.0 + 0.5 * 0.5, 1.0])  # pressure 1.5
    assert bandwidth_slowdowns(loads, 40.0, [1.5, 1.5]) == [1.0, 1.0]  # slowed by time-slicing: they draw less


def test_mps_and_gpu_time_slicing() -> None:
    small = [gpu("a", 0.3), gpu("b", 0.3)]
    assert mps_slowdowns(small, 1000.0) == [1.0, 1.0]
    assert mps_percentages(small) == [50, 50]
    assert gpu_time_sliced_slowdowns(small) == [2.0, 2.0]  # turns on the GPU: no overlap, whatever the utilization
    busy = [gpu("a", 0.9), gpu("b", 0.6)]
    assert mps_slowdowns(busy, 1000.0) == pytest.approx([1.5, 1.5])
    assert mps_percentages(busy) == [60, 40]
    assert gpu_time_sliced_slowdowns(busy) == [2.0, 2.0]


def test_core_splits_and_cpusets() -> None:
    assert core_splits(2, 2) == [(1, 1)]
    assert core_splits(4, 2) == [(1, 3), (2, 2), (3, 1)]
    assert core_splits(1, 2) == []
    assert len(core_splits(64, 2)) == 15 and all(sum(s) == 64 for s in core_splits(64, 2))
    assert cpuset([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and cpuset([3]) == "3"


def test_mig_slices_fit_a_gpu() -> None:
    profiles = {p.name: p for p in mig_profiles("A100-40GB")}
    assert slices_fit([profiles["4g.20gb"], profiles["3g.20gb"]])
    assert not slices_fit([profiles["4g.20gb"], profiles["4g.20gb"]])  # 8 compute slices, one instance
    assert slices_fit([profiles["1g.5gb"]] * 7) and not slices_fit([profiles["1g.5gb"]] * 8)
    assert profiles["3g.20gb"].compute_fraction == pytest.approx(3 / 7 * 0.907)
    assert profiles["3g.20gb"].memory_fraction == 0.5
    assert mig_profiles("T4") == ()


def test_sharing_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        Sharing("cores", "cpu", ("b",), cpuset="0; rm -rf /")
    with pytest.raises(ValueError):
        Sharing("mig", "gpu", ("b",), mig_profile="3g.40gb'")
    with pytest.raises(ValueError):
        Sharing("mps", "cpu", ("b",), mps_percentage=50)


# Pack decisions on synthetic predictions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scaled:
    """Steps from the target: ``work`` GFLOP per sample over the candidate's share of the peak (``efficiency`` of it
    on a whole node, more on fewer cores: the jobs scale imperfectly), plus ``overhead_s`` of launches."""

    work: float = 1e-3
    overhead_s: float = 0.0
    name: str = "scaled"

    def predict(self, workload: Any, ceilings: Any, candidate: Any, recipe: Any) -> Prediction:
        device = ceilings.gpu if candidate.device == "gpu" else ceilings.cpu
        share, _ = thread_shares(candidate, ceilings.cores)
        cores = candidate.threads or ceilings.cores
        efficiency = 1.0 if candidate.device == "gpu" else 0.5 + 0.5 / cores  # 1 core: 100%, 2 cores: 75%, ...
        compute = self.work * 1e9 * workload.batch_size / (device.peak_gflops[candidate.precision] * 1e9 * share
                                                           * efficiency)
        step = compute + self.overhead_s
        terms = (("compute_s", compute), ("memory_s", 0.0), ("overhead_s", self.overhead_s),
                 ("bandwidth_gbs", device.bandwidth_gbs))
        return Prediction(step, step / 1.5, step * 1.5, 0.0, terms, "compute", self.name)


def write_job(folder: Path, name: str, device: str = "cpu", **constraints: Any) -> Path:
    write_onnx(folder / "model.onnx")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Job", "name": name, "task": "inference",
                                    "device": device, "model": {"onnx": "model.onnx", "batch_size": 8},
                                    "constraints": {"runtimes": ["onnxruntime"], **constraints}}))
    return path


def write_target(folder: Path, name: str = "node", cores: int = 2, memory_gb: float = 64, gpus: str | None = None,
                 scheduler: str = "none", engine: str = "podman") -> Path:
    document: dict[str, Any] = {"apiVersion": "modak/v1", "kind": "Target", "name": name,
                                "cpu": {"microarchitecture": "zen3", "cores_per_socket": cores,
                                        "peaks": {"fp32_gflops": 100.0 * cores, "memory_bandwidth_gbs": 40.0}},
                                "memory": {"size_gb": memory_gb}, "scheduler": {"kind": scheduler},
                                "container": {"engine": engine}}
    if gpus:
        document["gpus"] = {"model": gpus}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_two_cpu_jobs_split_the_cores(tmp_path: Path) -> None:
    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    result = api.pack(jobs, write_target(tmp_path), using=Scaled())
    assert len(result.groups) == 1 and result.groups[0].shared
    best = result.groups[0].chosen
    assert best is not None and best.mode == "cores"
    assert [p.sharing.cpuset for p in best.placements] == ["0", "1"]
    assert all(p.plan is not None and p.plan.choice.candidate.threads == 1 for p in best.placements)
    assert [round(p.slowdown or 0, 3) for p in best.placements] == [1.5, 1.5]  # 2 cores at 75% vs 1 core at 100%
    assert best.gain == pytest.approx(2 / 1.5)
    modes = {o.mode: o for o in result.groups[0].options}
    assert set(modes) == {"cores", "time-slicing"} and modes["time-slicing"].gain < 1  # both want both cores
    Draft202012Validator(SCHEMA).validate(result.to_dict())


def test_a_job_limit_is_respected(tmp_path: Path) -> None:
    jobs = [write_job(tmp_path, "a", max_slowdown=1.3), write_job(tmp_path, "b")]
    result = api.pack(jobs, write_target(tmp_path), using=Scaled())
    assert [g.shared for g in result.groups] == [False, False]
    reason = result.groups[0].reason
    assert "constraints.max_slowdown (1.3x)" in reason and "slowdown 1.50x" in reason
    assert all(not o.feasible for o in result.groups[0].options)


def test_memory_beyond_the_share_of_capacity_is_refused(tmp_path: Path) -> None:
    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    result = api.pack(jobs, write_target(tmp_path, memory_gb=1e-7), using=Scaled())
    assert not any(g.shared for g in result.groups)
    assert "memory: the jobs may hold" in result.groups[0].reason and "90% of the" in result.groups[0].reason


def test_no_gain_no_sharing(tmp_path: Path) -> None:
    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    perfect = Scaled()
    # one core: only time-slicing, which gains nothing
    result = api.pack(jobs, write_target(tmp_path, cores=1), using=perfect)
    assert not any(g.shared for g in result.groups)
    assert "would not raise throughput" in result.groups[0].reason and f"{MIN_GAIN:g}x" in result.groups[0].reason


def test_gpu_jobs_with_little_utilization_share_through_mps(tmp_path: Path) -> None:
    jobs = [write_job(tmp_path, "a", device="gpu"), write_job(tmp_path, "b", device="gpu")]
    result = api.pack(jobs, write_target(tmp_path, gpus="A100-40GB"), using=Scaled(work=1e-6, overhead_s=1e-3))
    best = result.groups[0].chosen
    assert best is not None and best.mode == "mps"
    assert [p.sharing.mps_percentage for p in best.placements] == [50, 50]
    modes = {o.mode for o in result.groups[0].options}
    assert modes == {"mps", "mig", "time-slicing"}
    mig = next(o for o in result.groups[0].options if o.mode == "mig")
    assert slices_fit([p for name in (pl.sharing.mig_profile for pl in mig.placements)
                       for p in mig_profiles("A100-40GB") if p.name == name])


def test_pack_needs_two_jobs(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        api.pack([write_job(tmp_path, "a")], write_target(tmp_path), using=Scaled())


# Rendered sharing: golden job scripts -------------------------------------------------------------------------------


def _render(tmp_path: Path, name: str, jobs: list[Path], target: Path, predictor: Scaled,
            modes: tuple[str, ...] = ("cores", "time-slicing", "mps", "mig")) -> dict[str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modak, "__version__", "0.0.0+golden")
        patch.setenv("SOURCE_DATE_EPOCH", "1735689600")
        result = api.pack(jobs, target, modes=modes, using=predictor)
        assert all(g.shared for g in result.groups)
        api.render_pack(result, tmp_path / name)
    texts = {}
    for folder in sorted((tmp_path / name).iterdir()):
        if folder.is_dir():
            plan = json.loads((folder / "plan.json").read_text())
            digest = __import__("hashlib").sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
            texts[folder.name] = (folder / "job.sh").read_text().replace(digest[:12], "<digest12>")
    return texts


GOLDEN_CASES = {
    # CPU core sets: bash with podman (--cpuset-cpus), Slurm with apptainer (taskset over the allocation's cores)
    "cores-bash-podman": dict(device="cpu", target=dict(scheduler="none", engine="podman"), predictor=Scaled()),
    "cores-slurm-apptainer": dict(device="cpu", target=dict(scheduler="slurm", engine="apptainer"), predictor=Scaled()),
    # MPS: small GPU jobs (Slurm's mps gres, the daemon started unless one runs)
    "mps-slurm-docker": dict(device="gpu", target=dict(scheduler="slurm", engine="docker", gpus="H100"),
                             predictor=Scaled(work=1e-6, overhead_s=1e-3)),
    # MIG: a site that allows MIG slices only (--modes mig); bash finds the slice with nvidia-smi -L
    "mig-bash-podman": dict(device="gpu", target=dict(scheduler="none", engine="podman", gpus="H100"),
                            predictor=Scaled(work=1e-6, overhead_s=1e-3), modes=("mig",)),
    # MIG under Slurm: the slice is a gres of its profile, CUDA_VISIBLE_DEVICES the one Slurm allocated
    "mig-slurm-apptainer": dict(device="gpu", target=dict(scheduler="slurm", engine="apptainer", gpus="A100-80GB"),
                                predictor=Scaled(work=1e-6, overhead_s=1e-3), modes=("mig",)),
}


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_sharing_scripts(tmp_path: Path, case: str) -> None:
    spec = GOLDEN_CASES[case]
    jobs = [write_job(tmp_path / "specs", n, device=spec["device"]) for n in ("alpha", "beta")]
    target = write_target(tmp_path / "specs", **spec["target"])
    texts = _render(tmp_path, case, jobs, target, spec["predictor"],
                    spec.get("modes", ("cores", "time-slicing", "mps", "mig")))
    assert set(texts) == {"alpha", "beta"}
    for job, text in texts.items():
        golden = GOLDEN / case / f"{job}.sh"
        if os.environ.get("MODAK_UPDATE_GOLDEN") == "1":
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
        assert golden.is_file(), f"missing golden file {golden}; create it with MODAK_UPDATE_GOLDEN=1"
        assert text == golden.read_text(), f"{case}/{job} differs from {golden}; regenerate with MODAK_UPDATE_GOLDEN=1"
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert all("modak pack: this job shares" in t for t in texts.values())


def test_mig_script_picks_the_slice_of_its_index(tmp_path: Path) -> None:
    """The rendered MIG lines select the n-th slice of the profile from nvidia-smi -L (a fake one here)."""
    spec = GOLDEN_CASES["mig-bash-podman"]
    jobs = [write_job(tmp_path / "specs", n, device="gpu") for n in ("alpha", "beta")]
    texts = _render(tmp_path, "mig", jobs, write_target(tmp_path / "specs", **spec["target"]), spec["predictor"],
                    spec["modes"])
    line = next(line for line in texts["beta"].splitlines() if "-v profile=" in line)
    profile, index = line.split("profile=")[1].split()[0], int(line.split("-v n=")[1].split()[0])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-aaaa)'\n"
        f"echo '  MIG {profile}     Device  0: (UUID: MIG-first)'\n"
        f"echo '  MIG {profile}     Device  1: (UUID: MIG-second)'\n")
    (bin_dir / "podman").write_text("#!/bin/sh\necho \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "beta.sh"
    script.write_text(texts["beta"].replace("<digest12>", "0123456789ab"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"CUDA_VISIBLE_DEVICES={['MIG-first', 'MIG-second'][index]}" in out.stdout


# The command line ---------------------------------------------------------------------------------------------------


def test_cli_json_and_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    out = tmp_path / "out"
    code = main(["pack", *map(str, jobs), "--target", str(write_target(tmp_path)), "--predictor", "roofline",
                 "--json", "--render", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    document = json.loads(captured.out)
    Draft202012Validator(SCHEMA).validate(document)
    assert json.loads((out / "pack.json").read_text()) == document
    assert {p.name for p in out.iterdir()} == {"a", "b", "pack.json"}
    assert (out / "a" / "job.sh").is_file() and (out / "b" / "Dockerfile").is_file()


def test_cli_bad_target_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    code = main(["pack", *map(str, jobs), "--target", str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(tmp_path / "missing.yaml") in err[0]


def test_a_cpuset_of_several_ranges_renders(tmp_path: Path) -> None:
    from modak.render.ir import build_description
    from modak.render.render import render_text

    jobs = [write_job(tmp_path, "a"), write_job(tmp_path, "b")]
    plan = api.pack(jobs, write_target(tmp_path, cores=8), using=Scaled()).jobs[0].alone
    sharing = Sharing("cores", "cpu", ("b",), cpuset=cpuset([0, 1, 4]))
    text = render_text(build_description(plan, sharing=sharing), "job.sh")
    assert "MODAK_CPUSET=${MODAK_CPUSET:-0-1,4}" in text and '--cpuset-cpus "$MODAK_CPUSET"' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
