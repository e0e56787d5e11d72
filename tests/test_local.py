"""``local``: the machine modak runs on, probed once per host (real probe, quick sizes) and reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modak.hardware.probe import HYPERVISOR_HIDDEN_FLAGS, host_microarchitecture

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"


def modak(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MODAK_CACHE": str(cache)})


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A cache holding this host's real (quick) probe, and the probe as cached."""
    cache = tmp_path_factory.mktemp("local-cache")
    result = modak("probe", "--quick", cache=cache)
    assert result.returncode == 0, result.stderr
    assert "GEMM fp32 GFLOP/s by threads (best kernel)" in result.stdout and "pytorch:" in result.stdout
    cached = list((cache / "probe").glob("*.json"))
    assert len(cached) == 1 and str(cached[0]) in result.stdout
    return cache, json.loads(cached[0].read_text())


@pytest.mark.slow
def test_target_local_reuses_the_hosts_cached_probe_and_names_its_cpu(probed, tmp_path) -> None:
    cache, probe = probed
    assert probe["microarchitecture"] == host_microarchitecture().name
    assert set(probe["gemm_kernels"]["fp32"]) >= {"pytorch", "onnxruntime", "openvino"}
    assert set(probe["gemm_kernels"]["int8"]) == {"onnxruntime"}  # MatMulInteger, what quantized models run
    assert max(probe["gemm_gflops"]["int8"].values()) > 0
    best = max(probe["gemm_gflops"]["fp32"].values())
    assert best == max(rate for kernel in probe["gemm_kernels"]["fp32"].values() for rate in kernel.values())
    assert len(probe["triad_spread"]) == len(probe["triad_gbs"])
    plan = modak("plan", str(JOB), "--target", "local", "--json", cache=cache)
    assert plan.returncode == 0, plan.stderr
    assert "probing" not in plan.stderr  # reused, not measured again
    choice = json.loads(plan.stdout)["candidates"][0]
    assert choice["roofline"]["peak_gflops"] <= round(best, 1)
    # A job can say `target: local` itself.
    job = tmp_path / "job.yaml"
    job.write_text(JOB.read_text().replace("target: target.yaml", "target: local"))
    assert json.loads(modak("plan", str(job), "--json", cache=cache).stdout)["target"] == "local"


@pytest.mark.slow
def test_cpu_local_in_a_target_file_keeps_the_site_settings_and_a_given_memory(probed, tmp_path) -> None:
    cache, probe = probed
    target = tmp_path / "target.yaml"
    target.write_text("apiVersion: modak/v1\nkind: Target\nname: site\ncpu: local\nmemory: {size_gb: 3}\n"
                      "container: {engine: podman, base_images: {debian: localhost/debian-base:bookworm}}\n")
    script = ("import sys; from modak.api import load as load_job; "
              f"t = load_job({str(JOB)!r}, {str(target)!r}).target; "
              "print(t.name, t.cpu.microarchitecture, t.cpu.peaks.fp32_gflops, t.memory.size_gb, "
              "t.container.base_images['debian'], t.cpu.peaks.core_memory_bandwidth_gbs)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "MODAK_CACHE": str(cache)}).stdout.split()
    one_core = round(probe["triad_gbs"]["1"], 1) if len(probe["triad_gbs"]) > 1 else None  # one core of several
    assert out == ["site", probe["microarchitecture"], str(round(max(probe["gemm_gflops"]["fp32"].values()), 1)),
                   "3.0", "localhost/debian-base:bookworm", str(one_core)]


@pytest.mark.slow
def test_a_missing_probe_is_measured_once_and_said_so(tmp_path) -> None:
    """A probe cached by an older method of the probe (here method 1's file, any content) is not used either."""
    script = ("from modak.hardware.local import cache_path, local_probe; from modak.hardware import probe as p; "
              "p.GEMM_SIZES = (128,); p.TRIAD_ELEMENTS = 1 << 20; "
              "older = cache_path().with_name(cache_path().name.replace(f'.m{p.METHOD}.', '.m1.')); "
              "older.parent.mkdir(parents=True); older.write_text('{}'); "
              "first = local_probe(); second = local_probe(); print(first == second, older != cache_path())")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "MODAK_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    assert result.stderr.count("probing this machine's ceilings once") == 1


def test_a_gemm_rate_off_the_theoretical_peak_is_named() -> None:
    from modak.hardware.probe import _warnings

    assert _warnings(150.0, 156.0, 2.45, "cpufreq maximum") == ()
    above = _warnings(173.0, 156.5, 2.45, "/proc/cpuinfo")
    assert len(above) == 1 and "about 2.71 GHz" in above[0]
    below = _warnings(60.0, 156.5, 2.45, "/proc/cpuinfo")
    assert len(below) == 1 and "below half the theoretical peak" in below[0]
    assert _warnings(60.0, None, None, "unknown") == ()


@pytest.mark.slow
def test_a_probe_beside_a_cpu_hog_says_so_and_is_not_cached(tmp_path) -> None:
    """Real busy loops on this process's CPUs (one per CPU, so that any machine counts them) while the probe
    measures: the probe names them, warns that its ceilings may be low, and is not cached, so the next use probes
    again."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        script = ("from modak.hardware.local import cache_path, local_probe; from modak.hardware import probe as p; "
                  "p.GEMM_SIZES = (128,); p.TRIAD_ELEMENTS = 1 << 20; "
                  "first = local_probe(); second = local_probe(); "
                  "print(bool(first.contention), bool(second.contention), cache_path().exists())")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                                env={**os.environ, "MODAK_CACHE": str(tmp_path)})
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "False"]
    assert result.stderr.count("probing this machine's ceilings once") == 2
    assert result.stderr.count("the probe did not run alone (other processes used") == 2
    assert "probe again on a quiet machine (this result is not cached)" in result.stderr


def test_a_guest_is_named_past_the_flags_its_hypervisor_hides(monkeypatch) -> None:
    import archspec.cpu
    import archspec.cpu.detect

    zen4 = archspec.cpu.TARGETS["zen4"]
    generic = archspec.cpu.TARGETS["x86_64_v4"]

    def guest(features: set[str]) -> str:
        info = archspec.cpu.Microarchitecture("guest", [], "AuthenticAMD", set(features), {})
        monkeypatch.setattr(archspec.cpu, "host", lambda: generic)
        monkeypatch.setattr(archspec.cpu.detect, "detected_info", lambda: info)
        return host_microarchitecture().name

    # A KVM guest's Zen 4: every flag but the L1D flush and protection keys.
    assert guest(set(zen4.features) - HYPERVISOR_HIDDEN_FLAGS) == "zen4"
    # A flag that changes the kernels (AVX-512 bf16) missing: not a Zen 4, the most specific it can be.
    lesser = guest(set(zen4.features) - HYPERVISOR_HIDDEN_FLAGS - {"avx512_bf16"})
    assert lesser != "zen4" and archspec.cpu.TARGETS[lesser].vendor == "AuthenticAMD"
    # Another vendor's flags: the generic level, as archspec says.
    monkeypatch.setattr(archspec.cpu, "host", lambda: generic)
    monkeypatch.setattr(archspec.cpu.detect, "detected_info", lambda: archspec.cpu.Microarchitecture(
        "guest", [], "VIA", set(zen4.features), {}))
    assert host_microarchitecture().name == "x86_64_v4"

